/*
 * What an MPI job costs per rank as the rank count grows, measured the way
 * scripts/bench-scale.sh measures oxccl: each rank notes the time at the
 * top of main, initialises MPI, runs one 8-byte MPI_Allreduce (checked:
 * the sum of the ranks' numbers), then reads its own peak resident memory
 * (VmHWM). Rank 0 prints one line:
 *
 *   ranks N launch_to_init_s A launch_to_first_s B peak_mb_total C peak_mb_per_rank D
 *
 * launch_* count from LAUNCH_T0 (seconds since the epoch, set by the script
 * just before mpirun) to the slowest rank's end of MPI_Init and of the
 * first all-reduce: process start-up, MPI's wire-up and the first call.
 * The memory is each process's own (libraries mapped and touched count,
 * as they do for an oxccl rank's thread in one process the library is
 * counted once).
 *
 * Build: mpicc -O2 -o scale_probe scale_probe.c
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static double vm_hwm_mb(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    double kb = 0;
    if (!f) return 0;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "VmHWM:", 6) == 0) {
            kb = atof(line + 6);
            break;
        }
    }
    fclose(f);
    return kb / 1024.0;
}

int main(int argc, char **argv) {
    double start = now();
    const char *t0s = getenv("LAUNCH_T0");
    double t0 = t0s ? atof(t0s) : start;
    MPI_Init(&argc, &argv);
    double inited = now() - t0;
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    long long mine = rank + 1, sum = 0;
    MPI_Allreduce(&mine, &sum, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    double first = now() - t0;
    int ok = sum == (long long)n * (n + 1) / 2;
    double hwm = vm_hwm_mb();
    double times[2] = {inited, first}, worst[2];
    double total = 0;
    int all_ok = 0;
    MPI_Reduce(times, worst, 2, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    MPI_Reduce(&hwm, &total, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
    MPI_Reduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        if (!all_ok) {
            fprintf(stderr, "scale_probe: wrong all-reduce result\n");
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        printf("ranks %d launch_to_init_s %.3f launch_to_first_s %.3f peak_mb_total %.1f "
               "peak_mb_per_rank %.2f\n",
               n, worst[0], worst[1], total, total / n);
    }
    MPI_Finalize();
    return 0;
}

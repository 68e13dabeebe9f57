/*
 * MPI collectives timed the way `oxccl perf` times oxccl's, so the two
 * tables line up column for column (nccl-tests' layout): size, count, type,
 * redop, root, then time (us), algbw and busbw (GB/s) and #wrong for the
 * out-of-place and the in-place form.
 *
 * Build against any MPI: mpicc -O2 -o coll_bench coll_bench.c
 * Run:   mpirun -np 2 ./coll_bench all_reduce -b 8 -e 8388608 -f 2 -n 100 -w 10
 * Collectives: all_reduce, all_gather, reduce_scatter, broadcast, sendrecv.
 * Data: float32; reductions are sums; broadcast's root is rank 0; sendrecv
 * is nccl-tests' ring exchange (send to rank+1, receive from rank-1).
 *
 * Sizes and counts follow nccl-tests (and oxccl perf): `size` is the larger
 * buffer in bytes; all_gather and reduce_scatter round each rank's block
 * down to a multiple of 16 bytes. Time is the mean per call over -n calls
 * after -w warm-up calls and a barrier, averaged over ranks. Every size is
 * checked after timing: inputs are small integers, so float32 sums are
 * exact and any difference from the expected value counts as wrong.
 * MPI has no out-of-place broadcast: both halves time MPI_Bcast.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum coll { ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, BROADCAST, SENDRECV };

static const char *names[] = {"all_reduce", "all_gather", "reduce_scatter", "broadcast",
                              "sendrecv"};

static int rank, nranks;

/* The input element `i` of rank `r`: small integers, exact in float32 sums. */
static float input(int r, size_t i) { return (float)((r + 1) * (int)(i % 61 + 1)); }

static double bus_factor(enum coll c, int n) {
    switch (c) {
    case ALL_REDUCE:
        return 2.0 * (n - 1) / n;
    case ALL_GATHER:
    case REDUCE_SCATTER:
        return (double)(n - 1) / n;
    default:
        return 1.0;
    }
}

/* Send and receive element counts for a nominal size (nccl-tests' rule). */
static void counts(enum coll c, size_t bytes, size_t *send, size_t *recv, size_t *param) {
    size_t count = bytes / sizeof(float);
    size_t block = (count / (size_t)nranks) & ~(size_t)(16 / sizeof(float) - 1);
    switch (c) {
    case ALL_GATHER:
        *send = block, *recv = block * nranks, *param = block;
        break;
    case REDUCE_SCATTER:
        *send = block * nranks, *recv = block, *param = block;
        break;
    default:
        *send = count, *recv = count, *param = count;
    }
}

struct bufs {
    float *send, *recv;
    size_t scount, rcount;
};

/* One call; `in_place` uses MPI_IN_PLACE (or the one buffer) as NCCL does. */
static void call(enum coll c, struct bufs *b, int in_place) {
    int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
    switch (c) {
    case ALL_REDUCE:
        MPI_Allreduce(in_place ? MPI_IN_PLACE : b->send, b->recv, (int)b->rcount, MPI_FLOAT,
                      MPI_SUM, MPI_COMM_WORLD);
        break;
    case ALL_GATHER:
        MPI_Allgather(in_place ? MPI_IN_PLACE : b->send, (int)b->scount, MPI_FLOAT, b->recv,
                      (int)b->scount, MPI_FLOAT, MPI_COMM_WORLD);
        break;
    case REDUCE_SCATTER:
        /* In place, MPI reads the n blocks from recvbuf and leaves the
         * result in its first block. */
        if (in_place)
            MPI_Reduce_scatter_block(MPI_IN_PLACE, b->send, (int)b->rcount, MPI_FLOAT, MPI_SUM,
                                     MPI_COMM_WORLD);
        else
            MPI_Reduce_scatter_block(b->send, b->recv, (int)b->rcount, MPI_FLOAT, MPI_SUM,
                                     MPI_COMM_WORLD);
        break;
    case BROADCAST:
        MPI_Bcast(b->recv, (int)b->rcount, MPI_FLOAT, 0, MPI_COMM_WORLD);
        break;
    case SENDRECV:
        if (in_place)
            MPI_Sendrecv_replace(b->recv, (int)b->rcount, MPI_FLOAT, next, 7, prev, 7,
                                 MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        else
            MPI_Sendrecv(b->send, (int)b->scount, MPI_FLOAT, next, 7, b->recv, (int)b->rcount,
                         MPI_FLOAT, prev, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        break;
    }
}

/* Puts this rank's inputs where the call reads them. */
static void fill(enum coll c, struct bufs *b, int in_place) {
    size_t i;
    for (i = 0; i < b->scount; i++)
        b->send[i] = input(rank, i);
    for (i = 0; i < b->rcount; i++)
        b->recv[i] = -1.0f;
    if (c == BROADCAST && rank == 0)
        for (i = 0; i < b->rcount; i++)
            b->recv[i] = input(0, i);
    if (!in_place)
        return;
    switch (c) {
    case ALL_REDUCE:
    case SENDRECV:
        for (i = 0; i < b->rcount; i++)
            b->recv[i] = input(rank, i);
        break;
    case ALL_GATHER:
        for (i = 0; i < b->scount; i++)
            b->recv[(size_t)rank * b->scount + i] = input(rank, i);
        break;
    default:
        break; /* reduce_scatter in place reads `send`; broadcast above */
    }
}

/* Wrong elements of this rank's result. */
static long long verify(enum coll c, struct bufs *b, int in_place) {
    long long wrong = 0;
    size_t i;
    int r, prev = (rank + nranks - 1) % nranks;
    const float *out = (c == REDUCE_SCATTER && in_place) ? b->send : b->recv;
    for (i = 0; i < b->rcount; i++) {
        float want = 0;
        switch (c) {
        case ALL_REDUCE:
            for (r = 0; r < nranks; r++)
                want += input(r, i);
            break;
        case ALL_GATHER:
            want = input((int)(i / b->scount), i % b->scount);
            break;
        case REDUCE_SCATTER:
            for (r = 0; r < nranks; r++)
                want += input(r, (size_t)rank * b->rcount + i);
            break;
        case BROADCAST:
            want = input(0, i);
            break;
        case SENDRECV:
            want = input(prev, i);
            break;
        }
        wrong += out[i] != want;
    }
    return wrong;
}

/* Seconds per call (mean over ranks) and wrong elements (sum over ranks). */
static void half(enum coll c, struct bufs *b, int in_place, int iters, int warmup, double *secs,
                 long long *wrong) {
    int i;
    double t0, mine;
    long long w;
    /* A broadcast in place keeps the root's data; an all-reduce in place
     * grows it each call (timing only; the check refills). */
    fill(c, b, in_place);
    for (i = 0; i < warmup; i++)
        call(c, b, in_place);
    MPI_Barrier(MPI_COMM_WORLD);
    t0 = MPI_Wtime();
    for (i = 0; i < iters; i++)
        call(c, b, in_place);
    mine = (MPI_Wtime() - t0) / iters;
    MPI_Allreduce(&mine, secs, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    *secs /= nranks;
    fill(c, b, in_place);
    call(c, b, in_place);
    w = verify(c, b, in_place);
    MPI_Allreduce(&w, wrong, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
}

static void usage(void) {
    if (rank == 0)
        fprintf(stderr, "usage: coll_bench all_reduce|all_gather|reduce_scatter|broadcast|"
                        "sendrecv [-b MIN] [-e MAX] [-f FACTOR] [-n ITERS] [-w WARMUP]\n");
    MPI_Finalize();
    exit(2);
}

int main(int argc, char **argv) {
    enum coll c = ALL_REDUCE;
    size_t lo = 8, hi = 8 << 20, factor = 2, bytes;
    int iters = 100, warmup = 10, i, found = 0, len, mypid, *pids;
    char lib[MPI_MAX_LIBRARY_VERSION_STRING], host[MPI_MAX_PROCESSOR_NAME], *hosts, *nl;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    if (argc < 2)
        usage();
    for (i = 0; i < 5; i++)
        if (strcmp(argv[1], names[i]) == 0)
            c = (enum coll)i, found = 1;
    if (!found)
        usage();
    for (i = 2; i + 1 < argc; i += 2) {
        long long v = atoll(argv[i + 1]);
        if (v <= 0)
            usage();
        if (!strcmp(argv[i], "-b"))
            lo = (size_t)v;
        else if (!strcmp(argv[i], "-e"))
            hi = (size_t)v;
        else if (!strcmp(argv[i], "-f"))
            factor = (size_t)v;
        else if (!strcmp(argv[i], "-n"))
            iters = (int)v;
        else if (!strcmp(argv[i], "-w"))
            warmup = (int)v;
        else
            usage();
    }
    if (i != argc || factor < 2 || lo > hi)
        usage();
    if (c == SENDRECV && nranks < 2)
        usage();

    MPI_Get_library_version(lib, &len);
    if ((nl = strchr(lib, '\n')) != NULL)
        *nl = 0;
    if ((nl = strchr(lib, ',')) != NULL)
        *nl = 0;
    memset(host, 0, sizeof host);
    MPI_Get_processor_name(host, &len);
    pids = malloc(sizeof(int) * (size_t)nranks);
    hosts = malloc(sizeof host * (size_t)nranks);
    mypid = (int)getpid();
    MPI_Gather(&mypid, 1, MPI_INT, pids, 1, MPI_INT, 0, MPI_COMM_WORLD);
    /* Each rank's own host name: ranks may run on different hosts. */
    MPI_Gather(host, (int)sizeof host, MPI_CHAR, hosts, (int)sizeof host, MPI_CHAR, 0,
               MPI_COMM_WORLD);
    if (rank == 0) {
        printf("# Collective test starting: %s_perf\n", names[c]);
        printf("# library: %s\n", lib);
        printf("# nranks %d, float32, %d iterations after %d warm-up calls\n", nranks, iters,
               warmup);
        for (i = 0; i < nranks; i++)
            printf("#  Rank %2d Group  0 Pid %6d on %s device  0 [host] CPU\n", i, pids[i],
                   hosts + (size_t)i * sizeof host);
        printf("#%11s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s\n", "size",
               "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time",
               "algbw", "busbw", "#wrong");
        printf("#%11s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s\n", "(B)",
               "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)",
               "(GB/s)", "");
    }
    for (bytes = lo; bytes <= hi; bytes *= factor) {
        struct bufs b;
        size_t param, size;
        double t[2];
        long long w[2];
        int ip;
        counts(c, bytes, &b.scount, &b.rcount, &param);
        /* +1: malloc(0) may return NULL, which MPI reads as a missing buffer. */
        b.send = malloc((b.scount + 1) * sizeof(float));
        b.recv = malloc((b.rcount + 1) * sizeof(float));
        if (!b.send || !b.recv) {
            fprintf(stderr, "rank %d: out of memory at %zu bytes\n", rank, bytes);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        for (ip = 0; ip < 2; ip++)
            half(c, &b, ip, iters, warmup, &t[ip], &w[ip]);
        size = (b.scount > b.rcount ? b.scount : b.rcount) * sizeof(float);
        if (rank == 0) {
            printf("%12zu  %12zu  %8s  %6s  %6d", size, param, "float",
                   (c == ALL_REDUCE || c == REDUCE_SCATTER) ? "sum" : "none",
                   c == BROADCAST ? 0 : -1);
            for (ip = 0; ip < 2; ip++) {
                double us = t[ip] * 1e6, algbw = size / t[ip] / 1e9;
                printf("  %7.2f  %6.2f  %6.2f  %6lld", us, algbw, algbw * bus_factor(c, nranks),
                       w[ip]);
            }
            printf("\n");
            fflush(stdout);
        }
        free(b.send);
        free(b.recv);
    }
    MPI_Finalize();
    return 0;
}

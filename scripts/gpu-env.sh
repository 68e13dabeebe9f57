# Sourced by the scripts that run ON the GPU machine: what every GPU process
# there needs. NVLink multicast stays off (shared/gpu.md's rule for these
# shared machines), and CUDA 13.0's runtime libraries are found first.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
for d in /usr/local/cuda-13.0/targets/x86_64-linux/lib /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" && break
done

/* Stand-in for libnccl.so.2 beside the llama-bench that bench/llama-build.sh builds: llama.cpp's
 * CUDA backend links these NCCL entry points for reductions across GPUs and never calls them
 * with one GPU. Each returns ncclInternalError (3). Not part of strata. */
typedef int nccl_result;

nccl_result ncclAllReduce(void);
nccl_result ncclCommDestroy(void);
nccl_result ncclCommInitAll(void);
nccl_result ncclGroupEnd(void);
nccl_result ncclGroupStart(void);
const char *ncclGetErrorString(int r);

nccl_result ncclAllReduce(void)
{
    return 3;
}

nccl_result ncclCommDestroy(void)
{
    return 3;
}

nccl_result ncclCommInitAll(void)
{
    return 3;
}

nccl_result ncclGroupEnd(void)
{
    return 3;
}

nccl_result ncclGroupStart(void)
{
    return 3;
}

const char *ncclGetErrorString(int r)
{
    (void)r;
    return "nccl stand-in: one GPU only";
}

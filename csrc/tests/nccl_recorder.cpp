// A recording stand-in for libnccl.so.2, for the host test only: each NCCL entry point the
// plugins resolve records its arguments (no communication, no GPU). It lets the host test
// check how enqueue drives NCCL (function, count, type, reduce op, root, per-peer offsets)
// on a machine without a GPU. A "communicator" is a pointer to an int holding the rank count.
// The real collectives are checked on a GPU by tests/gpu/plugin_enqueue_check.py.
#include <nccl.h>

#include <cstring>
#include <vector>

namespace
{
struct Call
{
    char fn[16];
    void const* send;
    void* recv;
    size_t count;
    int type;
    int op;
    int peer; // root for broadcast, peer for send/recv
};
std::vector<Call> gCalls;
int gVersion = 23007;

ncclResult_t record(char const* fn, void const* send, void* recv, size_t count, ncclDataType_t type, int op, int peer)
{
    Call call{};
    std::strncpy(call.fn, fn, sizeof(call.fn) - 1);
    call.send = send;
    call.recv = recv;
    call.count = count;
    call.type = static_cast<int>(type);
    call.op = op;
    call.peer = peer;
    gCalls.push_back(call);
    return ncclSuccess;
}
} // namespace

#define EXPORT extern "C" __attribute__((visibility("default")))

EXPORT int recorder_call_count()
{
    return static_cast<int>(gCalls.size());
}

// Copies call `i` as: fn name into `fn` (16 chars), then send, recv, count, type, op, peer.
EXPORT int recorder_call(int i, char* fn, void const** send, void** recv, size_t* count, int* type, int* op, int* peer)
{
    if (i < 0 || i >= static_cast<int>(gCalls.size()))
        return -1;
    Call const& c = gCalls[static_cast<size_t>(i)];
    std::memcpy(fn, c.fn, sizeof(c.fn));
    *send = c.send;
    *recv = c.recv;
    *count = c.count;
    *type = c.type;
    *op = c.op;
    *peer = c.peer;
    return 0;
}

EXPORT void recorder_reset(int version)
{
    gCalls.clear();
    gVersion = version;
}

EXPORT ncclResult_t ncclGetVersion(int* version)
{
    *version = gVersion;
    return ncclSuccess;
}

EXPORT char const* ncclGetErrorString(ncclResult_t)
{
    return "recorder error";
}

EXPORT ncclResult_t ncclCommCount(ncclComm_t comm, int* count)
{
    *count = *reinterpret_cast<int const*>(comm);
    return ncclSuccess;
}

EXPORT ncclResult_t ncclAllReduce(
    void const* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op, ncclComm_t, cudaStream_t)
{
    return record("allReduce", send, recv, count, type, static_cast<int>(op), -1);
}

EXPORT ncclResult_t ncclAllGather(
    void const* send, void* recv, size_t count, ncclDataType_t type, ncclComm_t, cudaStream_t)
{
    return record("allGather", send, recv, count, type, -1, -1);
}

EXPORT ncclResult_t ncclReduceScatter(
    void const* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op, ncclComm_t, cudaStream_t)
{
    return record("reduceScatter", send, recv, count, type, static_cast<int>(op), -1);
}

EXPORT ncclResult_t ncclBroadcast(
    void const* send, void* recv, size_t count, ncclDataType_t type, int root, ncclComm_t, cudaStream_t)
{
    return record("broadcast", send, recv, count, type, -1, root);
}

EXPORT ncclResult_t ncclSend(void const* send, size_t count, ncclDataType_t type, int peer, ncclComm_t, cudaStream_t)
{
    return record("send", send, nullptr, count, type, -1, peer);
}

EXPORT ncclResult_t ncclRecv(void* recv, size_t count, ncclDataType_t type, int peer, ncclComm_t, cudaStream_t)
{
    return record("recv", nullptr, recv, count, type, -1, peer);
}

EXPORT ncclResult_t ncclGroupStart()
{
    return record("groupStart", nullptr, nullptr, 0, ncclInt8, -1, -1);
}

EXPORT ncclResult_t ncclGroupEnd()
{
    return record("groupEnd", nullptr, nullptr, 0, ncclInt8, -1, -1);
}

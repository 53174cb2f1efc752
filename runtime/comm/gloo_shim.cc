// runtime/comm/gloo_shim.cc: the Gloo shim (with runtime/io/sentencepiece_shim.cc, the
// only C++ of the runtime). It wraps Debian's libgloo (the options-style API of
// gloo/allreduce.h and friends, TCP transport) behind the C entry points of gloo_shim.h.
// Every entry point catches every exception and turns it into a status and a message;
// nothing is thrown across the C boundary.
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/gather.h>
#include <gloo/math.h>
#include <gloo/reduce.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/scatter.h>
#include <gloo/transport/tcp/device.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <typeinfo>
#include <vector>

#include "ddplua.h"
#include "comm/gloo_shim.h"

namespace {

// A store failure (status and message from our store), carried through Gloo's rendezvous.
struct StoreError : std::runtime_error {
  int status;
  StoreError(int s, const std::string &m) : std::runtime_error(m), status(s) {}
};

// Our store (as callbacks) behind Gloo's Store interface, every key under `prefix/`.
// wait() honours the timeout Gloo passes (the context's); get() waits with the store's.
class CallbackStore : public gloo::rendezvous::Store {
 public:
  CallbackStore(const ddp_gloo_store &s, std::string prefix, double timeout_s)
      : s_(s), prefix_(std::move(prefix)), timeout_s_(timeout_s) {}

  void set(const std::string &key, const std::vector<char> &data) override {
    char err[DDP_GLOO_ERR_CAP] = "";
    int st = s_.set(s_.ctx, full(key).c_str(), data.data(), data.size(), err);
    if (st) throw StoreError(st, err);
  }

  std::vector<char> get(const std::string &key) override {
    char err[DDP_GLOO_ERR_CAP] = "";
    void *data = nullptr;
    size_t len = 0;
    int st = s_.get(s_.ctx, full(key).c_str(), &data, &len, err);
    if (st) throw StoreError(st, err);
    std::vector<char> v((char *)data, (char *)data + len);
    free(data);
    return v;
  }

  void wait(const std::vector<std::string> &keys) override {
    wait(keys, std::chrono::milliseconds((long long)(timeout_s_ * 1000)));
  }

  void wait(const std::vector<std::string> &keys,
            const std::chrono::milliseconds &timeout) override {
    std::vector<std::string> names;
    std::vector<const char *> ptrs;
    for (const auto &k : keys) names.push_back(full(k));
    for (const auto &n : names) ptrs.push_back(n.c_str());
    char err[DDP_GLOO_ERR_CAP] = "";
    int st = s_.wait(s_.ctx, ptrs.data(), (int)ptrs.size(), timeout.count() / 1000.0, err);
    if (st) throw StoreError(st, err);
  }

 private:
  std::string full(const std::string &key) const { return prefix_ + "/" + key; }
  ddp_gloo_store s_;
  std::string prefix_;
  double timeout_s_;
};

std::chrono::milliseconds to_ms(double s) {
  return std::chrono::milliseconds((long long)(s * 1000.0 + 0.5));
}

void set_err(char *err, const std::string &msg) {
  snprintf(err, DDP_GLOO_ERR_CAP, "%s", msg.c_str());
}

}  // namespace

struct ddp_gloo {
  std::unique_ptr<gloo::rendezvous::Store> store;       // our store, keys under the prefix
  std::shared_ptr<gloo::transport::Device> dev;
  std::shared_ptr<gloo::rendezvous::Context> ctx;
  std::vector<std::string> peer_addr;                    // "[ip]:port" of peer j's end
  std::chrono::milliseconds timeout{300000};
  int rank = 0, size = 1;
  // The ring reduce-scatter's two partial chunks, kept between calls (grown, never zeroed
  // again): a fresh buffer per call cost its page faults on every call.
  std::unique_ptr<unsigned char[]> ring_scratch;
  size_t ring_scratch_bytes = 0;
  std::unique_ptr<gloo::transport::UnboundBuffer> ring_ub;  // over ring_scratch
};

struct ddp_gloo_p2p {
  ddp_gloo *g = nullptr;
  std::unique_ptr<gloo::transport::UnboundBuffer> buf;
  int other = -1;
  bool is_send = false;
  std::chrono::milliseconds timeout{0};  // the context's at posting time
};

namespace {

// "[ip]:port" part of a Gloo address string (it may carry a sequence number after it).
std::string host_port(const std::string &s) {
  size_t close = s.find(']');
  if (close == std::string::npos) return s;
  size_t end = close + 2;  // past "]:"
  while (end < s.size() && s[end] >= '0' && s[end] <= '9') end++;
  return s.substr(0, end);
}

// The group rank whose address a Gloo message names, or -1.
int peer_in_message(const ddp_gloo *g, const std::string &msg) {
  if (!g) return -1;
  for (size_t j = 0; j < g->peer_addr.size(); j++) {
    const std::string &a = g->peer_addr[j];
    if (a.empty()) continue;
    size_t at = msg.find(a);
    // The port must not be the prefix of a longer number.
    if (at != std::string::npos) {
      size_t end = at + a.size();
      if (end >= msg.size() || msg[end] < '0' || msg[end] > '9') return (int)j;
    }
  }
  return -1;
}

bool contains(const std::string &s, const char *what) { return s.find(what) != std::string::npos; }

// Run f, turning every exception into a status, a message in err and the peer at fault.
template <class F>
int guard(ddp_gloo *g, char *err, int *peer, F &&f) {
  if (peer) *peer = -1;
  err[0] = 0;
  std::string msg;
  int status;
  try {
    f();
    return DDP_OK;
  } catch (const StoreError &e) {
    set_err(err, e.what());
    return e.status ? e.status : DDP_ERR_IO;
  } catch (const gloo::IoException &e) {
    msg = e.what();
    status = DDP_ERR_PEER;
  } catch (const gloo::EnforceNotMet &e) {
    msg = e.what();
    status = DDP_ERR_STATE;
  } catch (const std::bad_alloc &) {
    set_err(err, "out of memory in Gloo");
    return DDP_ERR_MEMORY;
  } catch (const std::exception &e) {
    msg = e.what();
    status = DDP_ERR_IO;
  } catch (...) {
    set_err(err, "unknown exception from Gloo");
    return DDP_ERR_IO;
  }
  // Classify by Gloo's wording: timeouts say "Timed out" / "timeout", a dead peer shows as
  // a reset, a closed connection, or a failed read or write.
  if (contains(msg, "imed out") || contains(msg, "imeout")) status = DDP_ERR_TIMEOUT;
  else if (contains(msg, "reset") || contains(msg, "closed") || contains(msg, "Read error") ||
           contains(msg, "Write error") || contains(msg, "Broken pipe") ||
           contains(msg, "refused"))
    status = DDP_ERR_PEER;
  int p = peer_in_message(g, msg);
  if (peer) *peer = p;
  set_err(err, msg);
  return status;
}

template <class T>
gloo::AllreduceOptions::Func reduce_fn(int op) {
  using Fn = void (*)(void *, const void *, const void *, size_t);
  switch (op) {
    case DDP_REDUCE_SUM: return static_cast<Fn>(&gloo::sum<T>);
    case DDP_REDUCE_PRODUCT: return static_cast<Fn>(&gloo::product<T>);
    case DDP_REDUCE_MIN: return static_cast<Fn>(&gloo::min<T>);
    case DDP_REDUCE_MAX: return static_cast<Fn>(&gloo::max<T>);
  }
  throw std::invalid_argument("unknown reduce op " + std::to_string(op));
}

template <class T>
void allreduce_t(ddp_gloo *g, void *buf, size_t n, int op) {
  gloo::AllreduceOptions o(g->ctx);
  o.setOutput<T>((T *)buf, n);
  o.setReduceFunction(reduce_fn<T>(op));
  o.setTimeout(g->timeout);
  gloo::allreduce(o);
}

template <class T>
void reduce_t(ddp_gloo *g, void *buf, size_t n, int op, int root) {
  gloo::ReduceOptions o(g->ctx);
  o.setOutput<T>((T *)buf, n);
  o.setRoot(root);
  o.setReduceFunction(reduce_fn<T>(op));
  o.setTimeout(g->timeout);
  gloo::reduce(o);
}

// Dispatch a typed body on the dtypes Gloo reduces natively.
template <template <class> class Body, class... A>
void by_dtype(int dtype, A &&...a) {
  switch (dtype) {
    case DDP_F32: Body<float>::run(a...); return;
    case DDP_F64: Body<double>::run(a...); return;
    case DDP_I64: Body<int64_t>::run(a...); return;
    case DDP_I32: Body<int32_t>::run(a...); return;
    case DDP_U8: Body<uint8_t>::run(a...); return;
  }
  throw std::invalid_argument(std::string("no Gloo reduction for dtype ") + ddp_dtype_name(dtype));
}
template <class T> struct AllreduceBody {
  static void run(ddp_gloo *g, void *b, size_t n, int op) { allreduce_t<T>(g, b, n, op); }
};
template <class T> struct ReduceBody {
  static void run(ddp_gloo *g, void *b, size_t n, int op, int root) { reduce_t<T>(g, b, n, op, root); }
};

// Note [gloo ring reduce-scatter] (gloo_shim.h). Each step's chunk travels in segments of
// at most kRingSegmentBytes, all posted at once: the reduction of a segment overlaps the
// transfer of the next ones.
constexpr size_t kRingSegmentBytes = 1 << 20;

template <class T>
void reduce_scatter_t(ddp_gloo *g, void *out, const void *in, size_t n, int op) {
  const int size = g->size, rank = g->rank;
  const size_t bytes = n * sizeof(T);
  auto fn = reduce_fn<T>(op);
  const T *x = static_cast<const T *>(in);
  if (size == 1) {
    memcpy(out, in, bytes);
    return;
  }
  if (bytes == 0) return;
  // Two partial chunks: the one received this step is combined in place and sent next
  // step, while the following step receives into the other.
  if (g->ring_scratch_bytes < 2 * bytes) {
    g->ring_ub.reset();
    g->ring_scratch.reset(new unsigned char[2 * bytes]);
    g->ring_scratch_bytes = 2 * bytes;
    g->ring_ub = g->ctx->createUnboundBuffer(g->ring_scratch.get(), 2 * bytes);
  }
  unsigned char *part = g->ring_scratch.get();
  gloo::transport::UnboundBuffer *pb = g->ring_ub.get();
  const uint64_t slot = g->ctx->nextSlot();
  auto input = g->ctx->createUnboundBuffer(const_cast<void *>(in), bytes * (size_t)size);
  const int right = (rank + 1) % size, left = (rank + size - 1) % size;
  const size_t seg = kRingSegmentBytes / sizeof(T) * sizeof(T);
  const size_t nseg = (bytes + seg - 1) / seg;
  for (int s = 0; s + 1 < size; s++) {
    const size_t send_chunk = (size_t)((rank - s - 1 + 2 * size) % size);
    const size_t recv_chunk = (size_t)((rank - s - 2 + 2 * size) % size);
    const size_t recv_off = (size_t)(s & 1) * bytes, send_off = (size_t)((s - 1) & 1) * bytes;
    gloo::transport::UnboundBuffer *sent = s == 0 ? input.get() : pb;
    for (size_t j = 0; j < nseg; j++) {
      size_t at = j * seg, len = bytes - at < seg ? bytes - at : seg;
      pb->recv(left, slot, recv_off + at, len);
      sent->send(right, slot, (s == 0 ? send_chunk * bytes : send_off) + at, len);
    }
    const bool last = s + 2 == size;  // chunk `rank`: straight into out
    for (size_t j = 0; j < nseg; j++) {
      size_t at = j * seg, len = bytes - at < seg ? bytes - at : seg;
      if (!pb->waitRecv(g->timeout)) throw std::runtime_error("reduce_scatter: recv aborted");
      T *got = reinterpret_cast<T *>(part + recv_off + at);
      const T *mine = x + recv_chunk * n + at / sizeof(T);
      if (last) fn(static_cast<unsigned char *>(out) + at, got, mine, len / sizeof(T));
      else fn(got, got, mine, len / sizeof(T));
    }
    for (size_t j = 0; j < nseg; j++)
      if (!sent->waitSend(g->timeout)) throw std::runtime_error("reduce_scatter: send aborted");
  }
}
template <class T> struct ReduceScatterBody {
  static void run(ddp_gloo *g, void *o, const void *i, size_t n, int op) {
    reduce_scatter_t<T>(g, o, i, n, op);
  }
};

// Slots of point-to-point messages: a prefix no collective of Gloo uses, then the user tag.
constexpr uint64_t kP2PSlotPrefix = 0x7dULL << 56;

}  // namespace

extern "C" {

int ddp_gloo_new(ddp_gloo **out, const ddp_gloo_store *store, const char *prefix, int rank,
                 int size, const char *hostname, const char *iface, double timeout_s,
                 char *err) {
  *out = nullptr;
  ddp_gloo *g = nullptr;
  int st = guard(nullptr, err, nullptr, [&] {
    std::unique_ptr<ddp_gloo> p(new ddp_gloo());
    p->rank = rank;
    p->size = size;
    p->timeout = to_ms(timeout_s);
    p->store.reset(new CallbackStore(*store, prefix, timeout_s));
    gloo::rendezvous::Store *rv = p->store.get();
    gloo::transport::tcp::attr attr;
    if (iface && *iface) attr.iface = iface;
    else attr.hostname = hostname && *hostname ? hostname : "127.0.0.1";
    p->dev = gloo::transport::tcp::CreateDevice(attr);
    p->ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
    p->ctx->setTimeout(p->timeout);
    p->ctx->connectFullMesh(*rv, p->dev);

    // Publish "[ip]:port" of our end of each pair, then read each peer's end of its pair
    // with us: Gloo's transport errors name the peer by that address.
    std::string mine;
    for (int j = 0; j < size; j++) {
      if (j != rank) mine += host_port(p->ctx->getPair(j)->address().str());
      mine += "\n";
    }
    rv->set("ddp_addr/" + std::to_string(rank), std::vector<char>(mine.begin(), mine.end()));
    p->peer_addr.assign(size, "");
    for (int j = 0; j < size; j++) {
      if (j == rank) continue;
      std::string key = "ddp_addr/" + std::to_string(j);
      rv->wait({key}, p->timeout);
      std::vector<char> v = rv->get(key);
      std::string s(v.begin(), v.end());
      size_t pos = 0;
      for (int k = 0; k < rank && pos != std::string::npos; k++) {
        pos = s.find('\n', pos);
        if (pos != std::string::npos) pos++;
      }
      if (pos == std::string::npos) continue;
      size_t end = s.find('\n', pos);
      p->peer_addr[j] = s.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
    }
    g = p.release();
  });
  if (st == DDP_OK) *out = g;
  return st;
}

void ddp_gloo_free(ddp_gloo *g) {
  if (!g) return;
  try {
    if (g->ctx) g->ctx->closeConnections();
  } catch (...) {
  }
  try {
    delete g;
  } catch (...) {
  }
}

// Note [gloo abort]: a Gloo operation blocks in its buffers' waits, and only the peer's
// bytes, a transport error or the operation's timeout end it. The way in from another thread
// is the one Gloo itself takes when a wait times out (tcp::Context::signalException,
// "Application timeout caused pair closure"): tcp::Pair::signalExceptionExternal, which
// under the pair's own mutex (the one its device thread holds for every read and write)
// hands an exception to every buffer with an operation pending on the pair (their waits
// throw it), fails every later operation on the pair at once, and closes its socket, so the
// peer's operations on that connection fail too ("Connection closed by peer"). It is
// idempotent (a pair keeps its first exception). The context and its pairs stay allocated
// until ddp_gloo_free, which never runs at the same time (pg.c takes the group off the
// watcher's list first, and the communication thread is joined before it). Rejected:
// Context::closeConnections closes the sockets but wakes no buffer (a pending receive waits
// out its timeout); shutting the sockets down needs their descriptors, which Gloo does not
// give out (the published pair addresses are not the connections' ends in this Gloo); short
// Gloo timeouts in a loop cannot work, as a timed-out operation leaves its context unusable.
// Debian's libgloo-dev installs gloo/transport/tcp/pair.h but not gloo/common/memory.h,
// which it includes, so the one member the shim calls is declared below, in a stand-in for
// Gloo's class that adds no data member, virtual function or inline code (nothing of it is
// emitted: the call goes to libgloo's symbol); the pair's dynamic type is checked by name
// before the cast (a pair of another transport is left alone, and its waits end only at
// their timeout).
}  // extern "C"

namespace gloo {
namespace transport {
namespace tcp {
class Pair : public ::gloo::transport::Pair {
 public:
  std::exception_ptr signalExceptionExternal(const std::string &msg);  // libgloo's
};
}  // namespace tcp
}  // namespace transport
}  // namespace gloo

namespace {

constexpr const char *kTcpPairType = "N4gloo9transport3tcp4PairE";  // typeid(tcp::Pair).name()

}  // namespace

extern "C" {

void ddp_gloo_abort(ddp_gloo *g, const char *why) {
  if (!g || !g->ctx) return;
  std::string msg = why && *why ? why : "the process group was aborted";
  for (int j = 0; j < g->size; j++) {
    if (j == g->rank) continue;
    try {
      gloo::transport::Pair *pair = g->ctx->getPair(j).get();
      if (pair && strcmp(typeid(*pair).name(), kTcpPairType) == 0)
        static_cast<gloo::transport::tcp::Pair *>(pair)->signalExceptionExternal(msg);
    } catch (...) {
      // nothing to wake on a pair that cannot be reached
    }
  }
}

void ddp_gloo_set_timeout(ddp_gloo *g, double timeout_s) {
  g->timeout = to_ms(timeout_s);
  try {
    g->ctx->setTimeout(g->timeout);
  } catch (...) {
  }
}

int ddp_gloo_allreduce(ddp_gloo *g, void *buf, size_t n, int dtype, int op, char *err,
                       int *peer) {
  return guard(g, err, peer, [&] { by_dtype<AllreduceBody>(dtype, g, buf, n, op); });
}

int ddp_gloo_reduce(ddp_gloo *g, void *buf, size_t n, int dtype, int op, int root, char *err,
                    int *peer) {
  return guard(g, err, peer, [&] { by_dtype<ReduceBody>(dtype, g, buf, n, op, root); });
}

int ddp_gloo_broadcast(ddp_gloo *g, void *buf, size_t nbytes, int root, char *err, int *peer) {
  return guard(g, err, peer, [&] {
    gloo::BroadcastOptions o(g->ctx);
    o.setOutput<uint8_t>((uint8_t *)buf, nbytes);
    o.setRoot(root);
    o.setTimeout(g->timeout);
    gloo::broadcast(o);
  });
}

int ddp_gloo_allgather(ddp_gloo *g, void *out, const void *in, size_t nbytes, char *err,
                       int *peer) {
  return guard(g, err, peer, [&] {
    gloo::AllgatherOptions o(g->ctx);
    o.setInput<uint8_t>((uint8_t *)const_cast<void *>(in), nbytes);
    o.setOutput<uint8_t>((uint8_t *)out, nbytes * (size_t)g->size);
    o.setTimeout(g->timeout);
    gloo::allgather(o);
  });
}

int ddp_gloo_gather(ddp_gloo *g, void *out, const void *in, size_t nbytes, int root, char *err,
                    int *peer) {
  return guard(g, err, peer, [&] {
    gloo::GatherOptions o(g->ctx);
    o.setInput<uint8_t>((uint8_t *)const_cast<void *>(in), nbytes);
    if (g->rank == root) o.setOutput<uint8_t>((uint8_t *)out, nbytes * (size_t)g->size);
    o.setRoot(root);
    o.setTimeout(g->timeout);
    gloo::gather(o);
  });
}

int ddp_gloo_scatter(ddp_gloo *g, void *out, const void *in, size_t nbytes, int root,
                     char *err, int *peer) {
  return guard(g, err, peer, [&] {
    gloo::ScatterOptions o(g->ctx);
    std::vector<uint8_t *> ins;
    if (g->rank == root) {
      for (int i = 0; i < g->size; i++)
        ins.push_back((uint8_t *)const_cast<void *>(in) + (size_t)i * nbytes);
      o.setInputs<uint8_t>(ins, nbytes);
    }
    o.setOutput<uint8_t>((uint8_t *)out, nbytes);
    o.setRoot(root);
    o.setTimeout(g->timeout);
    gloo::scatter(o);
  });
}

int ddp_gloo_alltoall(ddp_gloo *g, void *out, const void *in, size_t chunk_bytes, char *err,
                      int *peer) {
  return guard(g, err, peer, [&] {
    gloo::AlltoallOptions o(g->ctx);
    o.setInput<uint8_t>((uint8_t *)const_cast<void *>(in), chunk_bytes * (size_t)g->size);
    o.setOutput<uint8_t>((uint8_t *)out, chunk_bytes * (size_t)g->size);
    o.setTimeout(g->timeout);
    gloo::alltoall(o);
  });
}

int ddp_gloo_reduce_scatter(ddp_gloo *g, void *out, const void *in, size_t n, int dtype, int op,
                            char *err, int *peer) {
  return guard(g, err, peer, [&] { by_dtype<ReduceScatterBody>(dtype, g, out, in, n, op); });
}

int ddp_gloo_alltoallv(ddp_gloo *g, void *out, const int64_t *out_bytes, const void *in,
                       const int64_t *in_bytes, char *err, int *peer) {
  return guard(g, err, peer, [&] {
    gloo::AlltoallvOptions o(g->ctx);
    std::vector<int64_t> ib(in_bytes, in_bytes + g->size), ob(out_bytes, out_bytes + g->size);
    o.setInput<uint8_t>((uint8_t *)const_cast<void *>(in), ib);
    o.setOutput<uint8_t>((uint8_t *)out, ob);
    o.setTimeout(g->timeout);
    gloo::alltoallv(o);
  });
}

int ddp_gloo_post_send(ddp_gloo *g, const void *buf, size_t nbytes, int dst, int tag,
                       ddp_gloo_p2p **out, char *err, int *peer) {
  *out = nullptr;
  return guard(g, err, peer, [&] {
    std::unique_ptr<ddp_gloo_p2p> p(new ddp_gloo_p2p());
    p->g = g;
    p->other = dst;
    p->is_send = true;
    p->timeout = g->timeout;
    p->buf = g->ctx->createUnboundBuffer(const_cast<void *>(buf), nbytes);
    p->buf->send(dst, kP2PSlotPrefix | (uint64_t)tag);
    *out = p.release();
  });
}

int ddp_gloo_post_recv(ddp_gloo *g, void *buf, size_t nbytes, int src, int tag,
                       ddp_gloo_p2p **out, char *err, int *peer) {
  *out = nullptr;
  return guard(g, err, peer, [&] {
    std::unique_ptr<ddp_gloo_p2p> p(new ddp_gloo_p2p());
    p->g = g;
    p->other = src;
    p->is_send = false;
    p->timeout = g->timeout;
    p->buf = g->ctx->createUnboundBuffer(buf, nbytes);
    p->buf->recv(src, kP2PSlotPrefix | (uint64_t)tag);
    *out = p.release();
  });
}

int ddp_gloo_p2p_wait(ddp_gloo_p2p *p, char *err, int *peer) {
  int st = guard(p->g, err, peer, [&] {
    bool ok = p->is_send ? p->buf->waitSend(p->timeout) : p->buf->waitRecv(p->timeout);
    if (!ok) throw std::runtime_error(p->is_send ? "send aborted" : "recv aborted");
  });
  // The only peer of a point-to-point message is the other side.
  if (st && peer && *peer < 0) *peer = p->other;
  return st;
}

void ddp_gloo_p2p_free(ddp_gloo_p2p *p) {
  try {
    delete p;
  } catch (...) {
  }
}

int ddp_gloo_barrier(ddp_gloo *g, char *err, int *peer) {
  return guard(g, err, peer, [&] {
    gloo::BarrierOptions o(g->ctx);
    o.setTimeout(g->timeout);
    gloo::barrier(o);
  });
}

}  // extern "C"

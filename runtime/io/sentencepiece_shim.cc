// runtime/io/sentencepiece_shim.cc: the SentencePiece shim (Debian's libsentencepiece,
// https://github.com/google/sentencepiece). It wraps SentencePieceTrainer and
// SentencePieceProcessor behind the C calls of sentencepiece_shim.h. Every entry point
// catches every exception and turns it, and every util::Status, into a ddplua status and a
// message; nothing is thrown across the C boundary. Arguments the library would CHECK-fail
// on (and abort) are validated by the caller, runtime/io/sentencepiece.c.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <unordered_map>
#include <vector>

#include "ddplua.h"
#include "io/sentencepiece_shim.h"

#ifdef DDP_HAVE_SENTENCEPIECE
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

struct ddp_spm_model {
  sentencepiece::SentencePieceProcessor sp;
};

namespace {

void put(char *err, const std::string &msg) { std::snprintf(err, DDP_SPM_ERR_CAP, "%s", msg.c_str()); }

// The ddplua status of a SentencePiece status (its codes follow absl's).
int status_of(const sentencepiece::util::Status &s) {
  using C = sentencepiece::util::StatusCode;
  switch (s.code()) {
    case C::kInvalidArgument:
    case C::kOutOfRange:
    case C::kFailedPrecondition: return DDP_ERR_ARG;
    case C::kNotFound:
    case C::kPermissionDenied:
    case C::kDataLoss: return DDP_ERR_IO;
    case C::kResourceExhausted: return DDP_ERR_MEMORY;
    default: return DDP_ERR_STATE;
  }
}

int fail(const sentencepiece::util::Status &s, char *err) {
  put(err, s.ToString());
  return status_of(s);
}

// Run fn, turning any exception into a status and a message.
template <typename F>
int guarded(char *err, F fn) {
  try {
    return fn();
  } catch (const std::bad_alloc &) {
    put(err, "out of memory");
    return DDP_ERR_MEMORY;
  } catch (const std::exception &e) {
    put(err, e.what());
    return DDP_ERR_STATE;
  } catch (...) {
    put(err, "unknown C++ exception");
    return DDP_ERR_STATE;
  }
}

}  // namespace

extern "C" int ddp_spm_shim_available(void) { return 1; }

extern "C" int ddp_spm_shim_train(const char *input, const char *model_prefix, int vocab_size,
                                  const char *model_type, int num_threads, char *err) {
  return guarded(err, [&]() -> int {
    std::unordered_map<std::string, std::string> kw = {
        {"input", input},
        {"model_prefix", model_prefix},
        {"vocab_size", std::to_string(vocab_size)},
        {"model_type", model_type},
        {"character_coverage", "1.0"},
        {"normalization_rule_name", "identity"},
        {"remove_extra_whitespaces", "false"},
        {"user_defined_symbols", "\n"},  // Note [newlines in SentencePiece]
        {"num_threads", std::to_string(num_threads)},
        {"minloglevel", "2"},
    };
    auto s = sentencepiece::SentencePieceTrainer::Train(kw);
    return s.ok() ? DDP_OK : fail(s, err);
  });
}

extern "C" int ddp_spm_shim_load(ddp_spm_model **out, const char *path, char *err) {
  *out = nullptr;
  return guarded(err, [&]() -> int {
    auto *m = new ddp_spm_model();
    auto s = m->sp.Load(path);
    if (!s.ok()) {
      delete m;
      return fail(s, err);
    }
    *out = m;
    return DDP_OK;
  });
}

extern "C" void ddp_spm_shim_free(ddp_spm_model *m) { delete m; }

extern "C" int ddp_spm_shim_vocab_size(const ddp_spm_model *m) { return m->sp.GetPieceSize(); }

extern "C" int ddp_spm_shim_encode(const ddp_spm_model *m, const char *text, size_t len, int **ids, size_t *n,
                                   char *err) {
  *ids = nullptr;
  *n = 0;
  return guarded(err, [&]() -> int {
    std::vector<int> v;
    auto s = m->sp.Encode(std::string(text, len), &v);
    if (!s.ok()) return fail(s, err);
    int *buf = static_cast<int *>(std::malloc((v.size() ? v.size() : 1) * sizeof(int)));
    if (!buf) throw std::bad_alloc();
    if (!v.empty()) std::memcpy(buf, v.data(), v.size() * sizeof(int));
    *ids = buf;
    *n = v.size();
    return DDP_OK;
  });
}

extern "C" int ddp_spm_shim_decode(const ddp_spm_model *m, const int *ids, size_t n, char **text, size_t *len,
                                   char *err) {
  *text = nullptr;
  *len = 0;
  return guarded(err, [&]() -> int {
    std::vector<int> v(ids, ids + n);
    std::string out;
    auto s = m->sp.Decode(v, &out);
    if (!s.ok()) return fail(s, err);
    char *buf = static_cast<char *>(std::malloc(out.size() + 1));
    if (!buf) throw std::bad_alloc();
    std::memcpy(buf, out.data(), out.size());
    buf[out.size()] = '\0';
    *text = buf;
    *len = out.size();
    return DDP_OK;
  });
}

#else  // built without SentencePiece: every call reports it

struct ddp_spm_model {
  int unused;
};

static int unavailable(char *err) {
  std::snprintf(err, DDP_SPM_ERR_CAP,
                "ddplua was built without SentencePiece (install libsentencepiece-dev, or make deps, and rebuild)");
  return DDP_ERR_UNAVAILABLE;
}

extern "C" int ddp_spm_shim_available(void) { return 0; }
extern "C" int ddp_spm_shim_train(const char *, const char *, int, const char *, int, char *err) {
  return unavailable(err);
}
extern "C" int ddp_spm_shim_load(ddp_spm_model **out, const char *, char *err) {
  *out = nullptr;
  return unavailable(err);
}
extern "C" void ddp_spm_shim_free(ddp_spm_model *m) { delete m; }
extern "C" int ddp_spm_shim_vocab_size(const ddp_spm_model *) { return 0; }
extern "C" int ddp_spm_shim_encode(const ddp_spm_model *, const char *, size_t, int **ids, size_t *n, char *err) {
  *ids = nullptr;
  *n = 0;
  return unavailable(err);
}
extern "C" int ddp_spm_shim_decode(const ddp_spm_model *, const int *, size_t, char **text, size_t *len, char *err) {
  *text = nullptr;
  *len = 0;
  return unavailable(err);
}

#endif

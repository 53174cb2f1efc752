--- ddplua.format: printing tensors as PyTorch and Torch7 do: the values (summarised with
-- "..." past 1000 elements, 3 at each edge), then dtype and shape.
local lib = require "ddplua.lib"
local ffi, C = lib.ffi, lib.C

local M = {}

local EDGE, THRESHOLD = 3, 1000

local function fmt_number(v, is_float, is_bool)
  if is_bool then return v ~= 0 and "true" or "false" end
  if not is_float then return string.format("%d", v) end
  if v ~= v then return "nan" end
  if v == math.huge then return "inf" end
  if v == -math.huge then return "-inf" end
  return string.format("%.4f", v)
end

--- The text of tensor t: values, then "[<dtype> tensor of shape (...)]", with " on cuda:k"
-- before the "]" for a device tensor (its values come through a host copy).
function M.tensor(t)
  if C.ddp_tensor_is_alive(t) == 0 then return "[freed tensor]" end
  local sizes = lib.size_table(t)
  local dtype = C.ddp_tensor_dtype(t)
  local device = C.ddp_tensor_device(t)
  local header = ("[%s tensor of shape (%s%s)%s]"):format(lib.dtype_name(dtype), table.concat(sizes, ", "),
    #sizes == 1 and "," or "", device >= 0 and (" on cuda:" .. device) or "")
  local n = tonumber(C.ddp_tensor_numel(t))
  if n == 0 then return "tensor([])\n" .. header end
  local flat = ffi.new("double[?]", n)
  lib.check(C.ddp_tensor_to_f64(t, flat))
  local is_float = C.ddp_dtype_is_floating(dtype) ~= 0
  local is_bool = dtype == C.DDP_BOOL
  local summarise = n > THRESHOLD
  -- row-major strides of the flat copy
  local strides, acc = {}, 1
  for d = #sizes, 1, -1 do strides[d] = acc; acc = acc * sizes[d] end
  local width = 0
  local cells = {}
  local function cell(i)
    local s = cells[i]
    if not s then
      s = fmt_number(flat[i], is_float, is_bool)
      cells[i] = s
      if #s > width then width = #s end
    end
    return s
  end
  local function render(d, base, indent)
    if d > #sizes then return ("%" .. width .. "s"):format(cell(base)) end
    local size, parts = sizes[d], {}
    local i = 0
    while i < size do
      if summarise and size > 2 * EDGE and i == EDGE then
        parts[#parts + 1] = "..."
        i = size - EDGE
      end
      parts[#parts + 1] = render(d + 1, base + i * strides[d], indent .. " ")
      i = i + 1
    end
    local sep = d == #sizes and ", " or (",\n" .. string.rep("\n", #sizes - d - 1) .. indent .. " ")
    return "[" .. table.concat(parts, sep) .. "]"
  end
  render(1, 0, "       ") -- first pass: the widest shown cell sets the column width
  local body = render(1, 0, "       ")
  return "tensor(" .. body .. ")\n" .. header
end

return M

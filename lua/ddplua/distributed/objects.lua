--- ddplua.distributed.objects: collectives of Lua values, PyTorch's all_gather_object,
-- gather_object, broadcast_object_list and scatter_object_list (reached as dist.*).
--
--   local got = {}
--   dist.all_gather_object(got, { rank = dist.get_rank(), loss = 0.25 })
--   -- got[i] is the table of global rank i - 1 (of group rank i - 1 with opts.group)
--
-- Values: nil, booleans, numbers (every double exactly: integers, floats, inf, -inf, nan,
-- -0), strings (any bytes), and tables of those, nested up to 512 deep (keys: strings,
-- numbers, booleans).
-- nil holes in a list stay holes (the table is sent as its pairs). A table reached twice is
-- sent twice (the copies are separate tables on arrival). Functions, userdata, cdata
-- (tensors included), threads, tables with a metatable, table keys and cycles raise an error
-- naming the key path ("object.layers[2].init"), before anything is sent. Received bytes
-- that are not one value a sender could make raise "<op>: object bytes: ... (corrupt
-- data)" on the receiving rank (Note [object bytes]).
--
-- Note [object collectives]: each rank serialises its value(s) into bytes (Lua, below), the
-- sizes are exchanged first as an i64 tensor, then the bytes, padded to the largest size,
-- as one u8 tensor, with the tensor collectives of the group's backend (gloo: host memory;
-- nccl: the tensors go to the current CUDA device and back). So every rank calls the same
-- collectives with the same shapes, whatever its own value's size.
local ffi = require "ffi"
local lib = require "ddplua.lib"
local C = lib.C

local M = {}

-- ---- serialisation --------------------------------------------------------------------------

-- Format (Note [object bytes] in runtime/include/ddplua/objects.h): one tag byte, then
--   "n" nil | "f" false | "t" true | "d" 8 bytes (a double, little-endian as this machine)
--   "s" u32 length, bytes | "T" u32 count, count times (key, value)
-- Tables nest at most DDP_OBJECT_MAX_DEPTH deep (the receiver refuses deeper ones).
local dbox = ffi.new("double[1]")
local u32box = ffi.new("uint32_t[1]")

local function path_of(path, key)
  if type(key) == "string" and key:match("^[%a_][%w_]*$") then return path .. "." .. key end
  if type(key) == "string" then return ("%s[%q]"):format(path, key) end
  return ("%s[%s]"):format(path, tostring(key))
end

local function fail(op, what, path)
  error(("%s: cannot send %s at %s (values: nil, booleans, numbers, strings and plain tables of them)")
    :format(op, what, path), 0)
end

local function u32(n)
  u32box[0] = n
  return ffi.string(u32box, 4)
end

local encode_value

local function encode_key(out, k, op, path)
  local tk = type(k)
  if tk ~= "string" and tk ~= "number" and tk ~= "boolean" then
    fail(op, "a " .. tk .. " key", path)
  end
  encode_value(out, k, op, path, nil)
end

encode_value = function(out, v, op, path, visiting)
  local tv = type(v)
  if tv == "nil" then
    out[#out + 1] = "n"
  elseif tv == "boolean" then
    out[#out + 1] = v and "t" or "f"
  elseif tv == "number" then
    dbox[0] = v
    out[#out + 1] = "d" .. ffi.string(dbox, 8)
  elseif tv == "string" then
    out[#out + 1] = "s" .. u32(#v)
    out[#out + 1] = v
  elseif tv == "table" then
    if getmetatable(v) ~= nil then fail(op, "a table with a metatable", path) end
    if visiting[v] then fail(op, "a cycle (a table that contains itself)", path) end
    visiting.depth = (visiting.depth or 0) + 1
    if visiting.depth > C.DDP_OBJECT_MAX_DEPTH then
      fail(op, ("a table nested deeper than %d levels"):format(C.DDP_OBJECT_MAX_DEPTH), path)
    end
    visiting[v] = true
    local n = 0
    for _ in pairs(v) do n = n + 1 end
    out[#out + 1] = "T" .. u32(n)
    for k, x in pairs(v) do
      local p = path_of(path, k)
      encode_key(out, k, op, p)
      encode_value(out, x, op, p, visiting)
    end
    visiting[v] = nil
    visiting.depth = visiting.depth - 1
  else
    fail(op, "a " .. tv, path)
  end
end

--- encode(v, op, path) -> the bytes of v (a string). Raises naming op and the key path below
-- `path` of the first value that cannot be sent.
function M.encode(v, op, path)
  local out = {}
  encode_value(out, v, op or "encode", path or "object", {})
  return table.concat(out)
end

-- Note [object bytes] (runtime/include/ddplua/objects.h): what a rank receives is checked
-- whole in C (ddp_object_parse: tags, lengths, keys, nesting, nothing after the value)
-- before any Lua value is built, so the builder below trusts the items it walks. The fuzz
-- target fuzz/object_decode.c runs that same check.
local item_array = ffi.typeof("ddp_object_item[?]")
local countbox = ffi.new("int64_t[1]")

-- The value whose first item is items[i] (0-based), its bytes at p: value, next item.
local function build(items, p, i)
  local it = items[i]
  local tag = it.tag
  if tag == 110 then return nil, i + 1 -- n
  elseif tag == 102 then return false, i + 1 -- f
  elseif tag == 116 then return true, i + 1 -- t
  elseif tag == 100 then -- d
    ffi.copy(dbox, p + it.pos, 8)
    return dbox[0], i + 1
  elseif tag == 115 then -- s
    return ffi.string(p + it.pos, it.len), i + 1
  end
  local t = {} -- T: keys are never nil or NaN (checked)
  i = i + 1
  for _ = 1, it.len do
    local k, x
    k, i = build(items, p, i)
    x, i = build(items, p, i)
    t[k] = x
  end
  return t, i
end

--- decode(p, n, op) -> the value held by the n bytes at p (a uint8_t pointer). Raises,
-- naming op and the fault, on bytes that are not one whole value (Note [object bytes]).
function M.decode(p, n, op)
  op = op or "decode"
  if type(n) ~= "number" or n < 0 or n % 1 ~= 0 then
    error(("%s: %s is not a byte count (corrupt data)"):format(op, tostring(n)), 0)
  end
  if C.ddp_object_parse(p, n, nil, 0, countbox) ~= 0 then
    error(op .. ": " .. ffi.string(C.ddp_last_error()), 0)
  end
  local count = countbox[0]
  local items = item_array(count)
  if C.ddp_object_parse(p, n, items, count, countbox) ~= 0 then
    error(op .. ": " .. ffi.string(C.ddp_last_error()), 0)
  end
  return (build(items, p, 0))
end

-- ---- transport ----------------------------------------------------------------------------

local function dist() return require "ddplua.distributed.distributed_c10d" end
local function dl() return require "ddplua.functions" end

local function raise(msg) error(msg, 3) end

-- M.encode, its error raised at the line that called the collective.
local function encode(v, op, path)
  local ok, r = pcall(M.encode, v, op, path)
  if not ok then error(r, 3) end
  return r
end

local function group_of(opts, op)
  local d = dist()
  if not d.is_initialized() then raise(op .. ": the default process group is not initialised (call init_process_group)") end
  return opts and opts.group or d.get_default_group()
end

-- Tensors of the group's backend: host tensors for gloo; for nccl, on the current device.
local function on_backend(g, t)
  if g.backend == "nccl" then return t:cuda() end
  return t
end

local function host(t)
  if C.ddp_tensor_device(t) >= 0 then return t:cpu() end
  return t
end

local function bytes_tensor(g, strings, width)
  local t = dl().zeros({ #strings, math.max(width, 1) }, { dtype = "u8" })
  local p = ffi.cast("uint8_t *", C.ddp_tensor_data(t))
  local row = math.max(width, 1)
  for i, s in ipairs(strings) do ffi.copy(p + (i - 1) * row, s, #s) end
  return on_backend(g, t)
end

local function sizes_tensor(g, sizes)
  local t = dl().zeros({ #sizes }, { dtype = "i64" })
  local p = ffi.cast("int64_t *", C.ddp_tensor_data(t))
  for i, n in ipairs(sizes) do p[i - 1] = n end
  return on_backend(g, t)
end

local function read_sizes(t)
  t = host(t)
  local p = ffi.cast("int64_t *", C.ddp_tensor_data(t))
  local out = {}
  for i = 1, t:numel() do out[i] = tonumber(p[i - 1]) end
  return out
end

-- The values in rows of a (k, width) u8 tensor, row i holding sizes[i] bytes.
local function decode_rows(t, sizes, op)
  t = host(t)
  local p = ffi.cast("uint8_t *", C.ddp_tensor_data(t))
  local width = t:numel() / #sizes
  local out = {}
  for i, n in ipairs(sizes) do
    -- a size a peer declared: never past its row (a scatter's source sends sizes and rows
    -- apart), never negative
    if n < 0 or n > width then
      error(("%s: the sender of value %d declared %d bytes, its row holds %d (corrupt data)"):format(op, i, n, width), 0)
    end
    out[i] = M.decode(p + (i - 1) * width, n, op)
  end
  return out
end

local function max_of(sizes)
  local m = 0
  for _, n in ipairs(sizes) do if n > m then m = n end end
  return m
end

local function group_opts(g) return { group = g } end

--- dist.all_gather_object(object_list, obj, opts{group}): object_list[i] becomes the obj of
-- group rank i - 1, on every rank (object_list is a table, cleared first; it is returned).
-- Raises on a value that cannot be sent (naming its key path), before any communication.
function M.all_gather_object(object_list, obj, opts)
  local op = "all_gather_object"
  if type(object_list) ~= "table" then raise(op .. ": object_list must be a table, got " .. type(object_list)) end
  local bytes = encode(obj, op, "obj")
  local g = group_of(opts, op)
  local world = g:size()
  local d = dist()
  local sizes_out = on_backend(g, dl().zeros({ world, 1 }, { dtype = "i64" }))
  d.all_gather(sizes_out, sizes_tensor(g, { #bytes }), group_opts(g))
  local sizes = read_sizes(sizes_out)
  local width = max_of(sizes)
  local data_out = on_backend(g, dl().zeros({ world, math.max(width, 1) }, { dtype = "u8" }))
  d.all_gather(data_out, bytes_tensor(g, { bytes }, width):view({ math.max(width, 1) }), group_opts(g))
  local values = decode_rows(data_out, sizes, op)
  for k in pairs(object_list) do object_list[k] = nil end
  for i = 1, world do object_list[i] = values[i] end
  return object_list
end

--- dist.gather_object(obj, object_gather_list, dst, opts{group}): on global rank dst
-- (default 0), object_gather_list[i] becomes the obj of group rank i - 1 (cleared first);
-- other ranks pass nil (a table there is left alone). Raises as all_gather_object.
function M.gather_object(obj, object_gather_list, dst, opts)
  local op = "gather_object"
  dst = dst or 0
  local bytes = encode(obj, op, "obj")
  local g = group_of(opts, op)
  local world = g:size()
  local d = dist()
  local me_dst = d.get_rank() == dst
  if me_dst and type(object_gather_list) ~= "table" then
    raise(op .. ": object_gather_list must be a table on the destination rank " .. dst)
  end
  local sizes_out = on_backend(g, dl().zeros({ world, 1 }, { dtype = "i64" }))
  d.all_gather(sizes_out, sizes_tensor(g, { #bytes }), group_opts(g))
  local sizes = read_sizes(sizes_out)
  local width = max_of(sizes)
  local out = me_dst and on_backend(g, dl().zeros({ world, math.max(width, 1) }, { dtype = "u8" })) or nil
  d.gather(bytes_tensor(g, { bytes }, width):view({ math.max(width, 1) }), out, dst, group_opts(g))
  if not me_dst then return nil end
  local values = decode_rows(out, sizes, op)
  for k in pairs(object_gather_list) do object_gather_list[k] = nil end
  for i = 1, world do object_gather_list[i] = values[i] end
  return object_gather_list
end

--- dist.broadcast_object_list(object_list, src, opts{group}): the contents of object_list on
-- global rank src (default 0) replace those of object_list on every other rank (holes and
-- non-integer keys included). Raises as all_gather_object (on src).
function M.broadcast_object_list(object_list, src, opts)
  local op = "broadcast_object_list"
  src = src or 0
  if type(object_list) ~= "table" then raise(op .. ": object_list must be a table, got " .. type(object_list)) end
  local g = group_of(opts, op)
  local d = dist()
  local me_src = d.get_rank() == src
  local bytes = me_src and encode(object_list, op, "object_list") or ""
  local size = sizes_tensor(g, { #bytes })
  d.broadcast(size, src, group_opts(g))
  local n = read_sizes(size)[1]
  local data = me_src and bytes_tensor(g, { bytes }, n) or on_backend(g, dl().zeros({ 1, math.max(n, 1) }, { dtype = "u8" }))
  d.broadcast(data, src, group_opts(g))
  if me_src then return object_list end
  local value = decode_rows(data, { n }, op)[1]
  for k in pairs(object_list) do object_list[k] = nil end
  for k, v in pairs(value) do object_list[k] = v end
  return object_list
end

--- dist.scatter_object_list(scatter_object_output_list, scatter_object_input_list, src,
-- opts{group}): on global rank src (default 0), scatter_object_input_list holds one value per
-- group rank (entry i for group rank i - 1); every rank's scatter_object_output_list[1]
-- becomes its value (other ranks pass nil as the input list). Raises as all_gather_object
-- (on src), or when the input list's length is not the group's size.
function M.scatter_object_list(scatter_object_output_list, scatter_object_input_list, src, opts)
  local op = "scatter_object_list"
  src = src or 0
  if type(scatter_object_output_list) ~= "table" then
    raise(op .. ": scatter_object_output_list must be a table, got " .. type(scatter_object_output_list))
  end
  local g = group_of(opts, op)
  local world = g:size()
  local d = dist()
  local me_src = d.get_rank() == src
  local strings, sizes = {}, {}
  if me_src then
    if type(scatter_object_input_list) ~= "table" then
      raise(op .. ": scatter_object_input_list must be a table on the source rank " .. src)
    end
    for i = 1, world do
      local ok, r = pcall(M.encode, scatter_object_input_list[i], op, ("scatter_object_input_list[%d]"):format(i))
      if not ok then error(r, 2) end
      strings[i] = r
      sizes[i] = #strings[i]
    end
  end
  local width_t = sizes_tensor(g, { me_src and max_of(sizes) or 0 })
  d.broadcast(width_t, src, group_opts(g))
  local width = read_sizes(width_t)[1]
  local my_size = on_backend(g, dl().zeros({ 1 }, { dtype = "i64" }))
  d.scatter(my_size, me_src and sizes_tensor(g, sizes):view({ world, 1 }) or nil, src, group_opts(g))
  local mine = on_backend(g, dl().zeros({ math.max(width, 1) }, { dtype = "u8" }))
  d.scatter(mine, me_src and bytes_tensor(g, strings, width) or nil, src, group_opts(g))
  local n = read_sizes(my_size)[1]
  scatter_object_output_list[1] = decode_rows(mine:view({ 1, math.max(width, 1) }), { n }, op)[1]
  return scatter_object_output_list
end

return M

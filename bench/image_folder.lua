--- bench/image_folder.lua: samples/s of an ImageFolder of JPEG files with the usual
-- ImageNet-style augmentation (RandomResizedCrop(224), RandomHorizontalFlip, ToFloat,
-- Normalize), batches of 32 through the DataLoader (--workers W, default 0: decoding and
-- augmentation on the training thread; W forked workers otherwise; a list such as 0,2
-- measures each setting in turn within every run, and prints the ratio of the last to the
-- first: the same process, so the same machine state, for both), against PyTorch's
-- DataLoader with torchvision's ImageFolder (PIL decoding, PIL transforms, ToTensor,
-- Normalize) at the same num_workers (bench/image_folder_torch.py), run alternately, each on one thread
-- (dl.set_num_threads(1); torch.set_num_threads(1) with OMP / OpenBLAS at 1): PIL's
-- decoding and transforms use one core, so this compares the two on equal terms.
--   build/ddplua bench/image_folder.lua [--images 256] [--size 256] [--runs 5] [--workers 0[,2]]
-- Writes the folder (RGB JPEGs of size x size, quality 90, made from Fashion-MNIST test
-- images scaled up and tinted) to a temporary folder, removed at the end. Prints one line
-- per run and the medians and ratio. With a list of settings it also measures in each run
-- what this machine gives two processes at once: two num_workers = 0 epochs in separate
-- processes side by side (`--solo ROOT`, this script's child mode), their samples/s summed,
-- over the num_workers = 0 epoch alone. Two workers are two such processes, so num_workers
-- = 2 over 0 cannot pass that ratio: it tells the machine's share of the result from ours.
local dl = require "ddplua"
local data = require "ddplua.data"
local os_ = require "ddplua.os"

local parser = require("ddplua.utils.argparse").ArgumentParser { prog = "image_folder.lua" }
parser:add_argument("--images", { type = "number", help = "images in the folder (default 256)" })
parser:add_argument("--size", { type = "number", help = "side of the square images (default 256)" })
parser:add_argument("--runs", { type = "number", help = "runs of each (default 5)" })
parser:add_argument("--workers", { help = "DataLoader num_workers of both, or a list such as 0,2 (default 0)" })
parser:add_argument("--solo", { help = "child mode: one num_workers = 0 epoch over the folder SOLO from --at on; prints its end" })
parser:add_argument("--at", { type = "number", help = "child mode: the monotonic second to start at" })
local args = parser:parse_args(arg)
local N, S, RUNS = args.images or 256, args.size or 256, args.runs or 5
local SETTINGS = {}
for w in tostring(args.workers or "0"):gmatch("[^,]+") do
  local v = tonumber(w)
  if not v or v < 0 or v % 1 ~= 0 then error("--workers: expected counts such as 0 or 0,2, got " .. tostring(args.workers), 0) end
  SETTINGS[#SETTINGS + 1] = v
end
dl.set_num_threads(1)

-- samples/s of one epoch over `folder` with num_workers = WORKERS
local function ddplua_run(WORKERS, folder)
  local ds = data.ImageFolder { root = folder, generator = dl.Generator(0),
    transform = data.Compose { data.RandomResizedCrop(224), data.RandomHorizontalFlip(), data.ToFloat(),
      data.Normalize({ 0.485, 0.456, 0.406 }, { 0.229, 0.224, 0.225 }) } }
  local loader = data.DataLoader(ds, { batch_size = 32, shuffle = true, generator = dl.Generator(1), num_workers = WORKERS })
  local t0 = os_.monotonic()
  local n = 0
  for x, y in loader:iter() do n = n + x:size(1) end
  return n / (os_.monotonic() - t0)
end

if args.solo then -- both children start at the same monotonic second, to run side by side
  os_.sleep(math.max(0, (args.at or 0) - os_.monotonic()))
  ddplua_run(0, args.solo)
  print(("ended_at %.6f"):format(os_.monotonic()))
  os.exit(0)
end

local tmp = os.tmpname()
local root = tmp .. ".images"
local fm = data.FashionMNIST { train = false, transform = false }
local resize = data.Resize { S, S }
for i = 1, N do
  local img, label = fm:get(i)
  local g = resize(img)                                          -- u8 (1, S, S)
  local rgb = dl.cat({ g, data.ColorJitter { brightness = { 0.7, 0.7 } }(g), data.RandomHorizontalFlip(1)(g) }, 1)
  local dir = ("%s/%d"):format(root, label)
  os_.mkdir_p(dir)
  data.write_jpeg(("%s/%05d.jpg"):format(dir, i), rgb, 90)
end

local function torch_run(WORKERS)
  local cmd = ("OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE /usr/bin/python3 "
    .. "bench/image_folder_torch.py %q %d 2>&1"):format(root, WORKERS)
  local p = io.popen(cmd)
  local out = p:read("*a")
  p:close()
  local v = tonumber(out:match("samples_per_s ([%d.]+)"))
  if not v then error("bench/image_folder_torch.py failed:\n" .. out, 0) end
  return v
end

-- samples/s of two num_workers = 0 epochs run at once in two processes of this script: both
-- start at the same second (after loading), the two epochs' samples over the time until the
-- later one ends
local function two_processes()
  local start = os_.monotonic() + 1.5
  -- $PPID: the shell's parent, this process (its executable is this ddplua)
  local cmd = ("/proc/$PPID/exe bench/image_folder.lua --solo %q --at %.6f 2>&1"):format(root, start)
  local p1, p2 = io.popen(cmd), io.popen(cmd)
  local last = start
  for _, p in ipairs { p1, p2 } do
    local out = p:read("*a")
    p:close()
    local t = tonumber(out:match("ended_at ([%d.]+)"))
    if not t then error("bench/image_folder.lua --solo failed:\n" .. out, 0) end
    last = math.max(last, t)
  end
  return 2 * N / (last - start)
end

local ours, theirs, machine = {}, {}, {}
for k = 1, #SETTINGS do ours[k], theirs[k] = {}, {} end
for r = 1, RUNS do
  for k, w in ipairs(SETTINGS) do
    ours[k][r] = ddplua_run(w, root)
    theirs[k][r] = torch_run(w)
    print(("run %d, num_workers %d: ddplua %.0f samples/s, PyTorch DataLoader + PIL %.0f samples/s"):format(
      r, w, ours[k][r], theirs[k][r]))
  end
  if #SETTINGS > 1 then
    machine[r] = two_processes() / ours[1][r]
    print(("run %d: two num_workers = 0 processes at once give %.2fx one alone"):format(r, machine[r]))
  end
end
local function median(t)
  local c = {}
  for i, v in ipairs(t) do c[i] = v end
  table.sort(c)
  return c[math.floor((#c + 1) / 2)]
end
for k, w in ipairs(SETTINGS) do
  print(("median: ddplua %.0f samples/s, PyTorch %.0f samples/s, ratio %.2f (%d JPEGs of %dx%d, %d runs, num_workers %d)"):format(
    median(ours[k]), median(theirs[k]), median(ours[k]) / median(theirs[k]), N, S, S, RUNS, w))
end
if #SETTINGS > 1 then
  -- the ratio of each run's pair (measured back to back), then their median
  local mine, torch = {}, {}
  for r = 1, RUNS do
    mine[r] = ours[#SETTINGS][r] / ours[1][r]
    torch[r] = theirs[#SETTINGS][r] / theirs[1][r]
  end
  print(("num_workers %d over %d: ddplua %.2fx (median of the runs' ratios; of the medians %.2fx), PyTorch %.2fx"):format(
    SETTINGS[#SETTINGS], SETTINGS[1], median(mine), median(ours[#SETTINGS]) / median(ours[1]), median(torch)))
  print(("two num_workers = 0 processes at once: %.2fx one alone (median of the runs)"):format(median(machine)))
end

for _, e in ipairs(os_.list_dir(root)) do
  for _, f in ipairs(os_.list_dir(root .. "/" .. e.name)) do os.remove(root .. "/" .. e.name .. "/" .. f.name) end
  os.remove(root .. "/" .. e.name)
end
os.remove(root)
os.remove(tmp)

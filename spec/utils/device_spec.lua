-- Specs for ddplua.utils.device on machines as they come (its CUDA paths run on the
-- simulated device in spec/cuda/train_device_spec.lua, through train.lua): cpu, bad names,
-- and the launcher's local rank (torchrun's, Slurm's and Open MPI's variables).
local device = require "ddplua.utils.device"
local dl = require "ddplua"

describe("ddplua.utils.device", function()
  it("chooses the cpu when asked, or when CUDA is missing", function()
    assert.are.equal("cpu", device.choose("cpu"))
    if not dl.cuda.is_available() then assert.are.equal("cpu", device.choose(nil)) end
  end)

  it("rejects malformed names, naming the program", function()
    local ok, err = pcall(device.choose, "tpu", { prog = "x.lua" })
    assert.is_false(ok)
    assert.are.equal("x.lua: --device must be cpu, cuda or cuda:K, got 'tpu'", err)
  end)

  it("reads LOCAL_RANK only under a launcher (WORLD_SIZE > 1)", function()
    local ws = tonumber(os.getenv("WORLD_SIZE") or "1")
    if ws > 1 then return end -- the specs themselves run under a launcher
    assert.is_nil(device.launcher_local_rank())
  end)

  it("finds the launcher's local rank under torchrun, srun and mpirun", function()
    local files = require "files"
    local exe = os.getenv("DDPLUA_EXE") or "./build/ddplua"
    local clear = "env -u WORLD_SIZE -u LOCAL_RANK -u RANK -u SLURM_NTASKS -u SLURM_LOCALID -u SLURM_PROCID "
      .. "-u OMPI_COMM_WORLD_SIZE -u OMPI_COMM_WORLD_LOCAL_RANK -u OMPI_COMM_WORLD_RANK -u PMI_SIZE -u MPI_LOCALRANKID "
    local code = files.quote('print("local rank " .. tostring(require("ddplua.utils.device").launcher_local_rank()))')
    for vars, want in pairs {
      [""] = "nil",
      ["WORLD_SIZE=4 LOCAL_RANK=3"] = "3",
      ["SLURM_NTASKS=2 SLURM_LOCALID=1"] = "1",
      ["OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_LOCAL_RANK=1"] = "1",
      ["OMPI_COMM_WORLD_SIZE=1 OMPI_COMM_WORLD_LOCAL_RANK=0"] = "nil", -- mpirun -np 1: one process
      ["OMPI_COMM_WORLD_SIZE=2"] = "0",
    } do
      local status, out = files.run(clear .. vars .. " " .. exe .. " -e " .. code)
      assert.equal(0, status, out)
      assert.equal("local rank " .. want .. "\n", out, vars)
    end
  end)
end)

-- Specs for the resume math of DistributedSampler (Note [elastic resume] in
-- lua/ddplua/distributed/sampler.lua): an epoch stopped after some batches on one world
-- size goes on with the remainder of its order on another world size, so that the samples
-- trained before and after cover the epoch exactly once; a remainder that does not divide
-- is padded from its own front (PyTorch's rule), cut with drop_last.
local DistributedSampler = require "ddplua.distributed.sampler"

-- The epoch's order: the share of the only rank of a world of 1.
local function base(n, epoch, opts)
  local s = DistributedSampler(n, { num_replicas = 1, rank = 0, seed = opts and opts.seed or 3 })
  s:set_epoch(epoch)
  return s:indices():tolist()
end

-- Each rank's indices of `epoch` on world size w, resumed at `processed`.
local function shares(n, w, epoch, processed, opts)
  local out = {}
  for r = 0, w - 1 do
    local o = { num_replicas = w, rank = r, seed = 3 }
    for k, v in pairs(opts or {}) do o[k] = v end
    local s = DistributedSampler(n, o)
    s:load_state_dict { epoch = epoch, processed = processed }
    out[r + 1] = s:indices():tolist()
    assert.equal(#out[r + 1], s:len())
  end
  return out
end

describe("DistributedSampler resume (elastic)", function()
  it("trains an epoch exactly once across a shrink from 3 to 2 ranks and a growth back to 3", function()
    local n, b, epoch = 240, 4, 5
    local seen = {}
    local function train(list, from, count)
      for i = from, from + count - 1 do
        local x = list[i]
        seen[x] = (seen[x] or 0) + 1
      end
    end
    -- 3 ranks train 6 batches each, recording them; the state is committed there
    local samplers, processed = {}, nil
    for r = 0, 2 do
      samplers[r + 1] = DistributedSampler(n, { num_replicas = 3, rank = r, seed = 3 })
      samplers[r + 1]:set_epoch(epoch)
      train(samplers[r + 1]:indices():tolist(), 1, 6 * b)
      for _ = 1, 6 do samplers[r + 1]:record_batch(b) end
    end
    local sd = samplers[1]:state_dict()
    assert.same({ epoch = epoch, processed = 6 * b * 3 }, sd)
    -- what was trained is the prefix of the epoch's order
    local order = base(n, epoch)
    for i = 1, sd.processed do assert.equal(1, seen[order[i]], "position " .. i) end
    -- 2 ranks go on from there for 9 batches each, then 3 ranks finish the epoch
    local two = shares(n, 2, epoch, sd.processed)
    for r = 1, 2 do train(two[r], 1, 9 * b) end
    local three = shares(n, 3, epoch, sd.processed + 9 * b * 2)
    for r = 1, 3 do
      assert.equal((n - sd.processed - 9 * b * 2) / 3, #three[r])
      train(three[r], 1, #three[r])
    end
    for i = 0, n - 1 do assert.equal(1, seen[i], "sample " .. i) end
  end)

  it("splits a remainder that does not divide as PyTorch pads an epoch: from its own front", function()
    local order = base(10, 0)
    local rem = {}
    for i = 4, 10 do rem[#rem + 1] = order[i] end -- processed = 3: 7 positions left
    local s = shares(10, 2, 0, 3)
    assert.same({ rem[1], rem[3], rem[5], rem[7] }, s[1])
    assert.same({ rem[2], rem[4], rem[6], rem[1] }, s[2]) -- padded by rem's first element
    local cut = shares(10, 2, 0, 3, { drop_last = true })
    assert.same({ rem[1], rem[3], rem[5] }, cut[1])
    assert.same({ rem[2], rem[4], rem[6] }, cut[2])
    local ragged = shares(10, 2, 0, 3, { pad = false })
    assert.same({ rem[1], rem[3], rem[5], rem[7] }, ragged[1])
    assert.same({ rem[2], rem[4], rem[6] }, ragged[2])
    -- nothing left: empty shares
    assert.same({ {}, {} }, shares(10, 2, 0, 10))
  end)

  it("keeps a resumed epoch's position across set_epoch of the same epoch, not of the next", function()
    local s = DistributedSampler(12, { num_replicas = 2, rank = 1, seed = 3 })
    s:load_state_dict { epoch = 2, processed = 8 }
    s:set_epoch(2)
    assert.equal(2, s:len())
    local order = base(12, 2)
    assert.same({ order[10], order[12] }, s:indices():tolist())
    s:record_batch(2)
    assert.same({ epoch = 2, processed = 12 }, s:state_dict())
    s:set_epoch(3)
    assert.equal(6, s:len())
    assert.same({ epoch = 3, processed = 0 }, s:state_dict())
    -- a plain (never resumed) epoch is PyTorch's split: rank 1 takes order[2], order[4], ...
    local o3 = base(12, 3)
    assert.same({ o3[2], o3[4], o3[6], o3[8], o3[10], o3[12] }, s:indices():tolist())
  end)

  it("refuses a state that is not a position in the epoch, and bad batch sizes", function()
    local s = DistributedSampler(12, { num_replicas = 2, rank = 0 })
    assert.has_error(function() s:load_state_dict { epoch = 0, processed = 13 } end,
      "DistributedSampler:load_state_dict: expected {epoch = integer, processed = 0 .. 12}, got {epoch = 0, processed = 13}")
    assert.has_error(function() s:load_state_dict(5) end,
      "DistributedSampler:load_state_dict: expected {epoch = integer, processed = 0 .. 12}, got number")
    assert.has_error(function() s:record_batch(-1) end,
      "DistributedSampler:record_batch: batch_size must be an integer >= 0, got -1")
  end)
end)

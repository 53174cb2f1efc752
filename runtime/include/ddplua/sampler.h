/* ddplua/sampler.h: part of the public API, included by ddplua.h only. */

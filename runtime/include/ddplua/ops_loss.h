/* ddplua/ops_loss.h: part of the public API, included by ddplua.h only. */

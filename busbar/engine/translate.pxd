# busbar/engine/translate.py compiled (Cython's augmenting .pxd, nothing declared: the module keeps
# its Python semantics). Every translated request runs these steps; interpreted, they were the one
# bytecode on a translated path (a streamed one: a feed and an _events per upstream chunk), which
# brought the interpreter's loop onto a path otherwise compiled.

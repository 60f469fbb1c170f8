# busbar/engine/translate.py compiled (Cython's augmenting .pxd: the module keeps its Python
# semantics). Every translated request runs these steps; interpreted, they were the one bytecode on
# a translated path (a streamed one: a feed and an _events per upstream chunk), which brought the
# interpreter's loop onto a path otherwise compiled. The two same-protocol steps are cpdef: the
# exchange calls them on every such attempt, in C.

from cbusbar.framing cimport splice

cpdef with_model(body, span, wire_json)
cpdef forwarded(names, headers)

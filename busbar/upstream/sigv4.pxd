# busbar/upstream/sigv4.py compiled (Cython's augmenting .pxd, nothing declared: the module keeps
# its Python semantics). Every Bedrock request is signed here; interpreted, the signature was the
# one piece of bytecode a Bedrock relay ran, and it brought the interpreter's loop (~200 cache
# lines of code, bench/code_lines.py --proto bedrock --size 4096) onto a path that is otherwise
# compiled.

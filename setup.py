"""Build: every cbusbar/**/*.pyx is compiled; there is no pure-Python fallback (the Cython modules are
the product). BUSBAR_EXT=path1.pyx,path2.pyx restricts a development rebuild to those modules."""
import glob
import os

from Cython.Build import cythonize
from setuptools import Extension, setup

sources = sorted(glob.glob("cbusbar/**/*.pyx", recursive=True))
# busbar's few hot Python modules that carry a typed layout in an augmenting .pxd beside them
# (busbar/engine/exchange.pxd): compiled from the .py itself.
sources += sorted(p[:-4] + ".py" for p in glob.glob("busbar/**/*.pxd", recursive=True))
only = os.environ.get("BUSBAR_EXT")
if only:
    sources = [s for s in sources if s in only.split(",")]

extensions = [
    Extension(os.path.splitext(src)[0].replace(os.sep, "."), [src], extra_compile_args=["-O2"])
    for src in sources
]

setup(
    ext_modules=cythonize(
        extensions,
        language_level=3,
        nthreads=os.cpu_count() or 1,
        compiler_directives={
            "boundscheck": False,
            "wraparound": False,
            "cdivision": True,
            "initializedcheck": False,
        },
    ),
)

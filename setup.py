"""Build: every cbusbar/**/*.pyx is compiled; there is no pure-Python fallback (the Cython modules are
the product). BUSBAR_EXT=path1.pyx,path2.pyx restricts a development rebuild to those modules;
BUSBAR_PGO and BUSBAR_NO_EXT are packaging/build_ext.sh's (the profile-guided build)."""
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
if os.environ.get("BUSBAR_NO_EXT") == "1":
    # packaging/build_ext.sh compiled every extension in place already (profile-guided); its last
    # step only registers the editable install, which would otherwise compile them all once more.
    sources = []

# The profile-guided build (packaging/build_ext.sh, what `make build` runs): BUSBAR_PGO=generate
# compiles instrumented extensions, packaging/pgo_train.py serves traffic through them and their
# counters land in build/pgo/, then BUSBAR_PGO=use compiles again with the hot blocks of each function
# laid out together and the blocks the traffic never ran moved out of line. Both compiles must see the
# same flags and object paths (gcc matches a profile to its function by both). Unset: a plain -O2 build.
PGO_DIR = os.path.abspath(os.path.join("build", "pgo"))
pgo = os.environ.get("BUSBAR_PGO", "")
if pgo == "generate":
    pgo_flags = ["-fprofile-generate=" + PGO_DIR, "-fprofile-update=single"]
elif pgo == "use":
    # partial training: a function the training never ran keeps its ordinary -O2 code instead of
    # being optimised for size as "never executed"; missing-profile: a module no trained request
    # imports (the CLI's helpers) is not an error.
    pgo_flags = ["-fprofile-use=" + PGO_DIR, "-fprofile-partial-training", "-Wno-missing-profile"]
elif pgo:
    raise SystemExit("BUSBAR_PGO=%r: expected generate, use or nothing" % pgo)
else:
    pgo_flags = []

extensions = [
    Extension(os.path.splitext(src)[0].replace(os.sep, "."), [src],
              extra_compile_args=["-O2"] + pgo_flags, extra_link_args=pgo_flags)
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

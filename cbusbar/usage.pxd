# The one usage backfill every stream encoder applies (usage.pyx). ir.pxd: MESSAGE_START carries
# the input side if the upstream knows it then, MESSAGE_DELTA the running totals; an upstream may
# report the prompt only at the start (Usage.input_known False on the delta) or not report usage at
# the end at all. An encoder folds each usage it sees into the totals it will write.

from cbusbar.ir cimport Usage


cdef Usage merge_usage(Usage known, Usage latest)

# Reasoning knobs shared by the codecs (reasoning.pyx): the effort word <-> thinking budget table
# (SPEC 1.5 limits.reasoning_effort_budgets defaults), and the rules Claude enforces on extended
# thinking, which the anthropic codec and the bedrock codec (Claude behind Converse) both apply.

# Claude's floor for thinking.budget_tokens, and the answer room SPEC 1.5 keeps under max_tokens.
cdef enum:
    CLAUDE_MIN_BUDGET = 1024
    CLAUDE_MIN_ANSWER = 1024


cpdef object budget_of_effort(str effort)            # tokens, 0 for "none", None when unknown
cpdef str effort_of_budget(object budget)            # the smallest word covering it; None for 0
cpdef object thinking_budget(object budget, str effort)   # the budget a request asks for, or None
cpdef object claude_budget(object budget, str effort, object max_tokens)
cdef bint claude_top_p_ok(object top_p)

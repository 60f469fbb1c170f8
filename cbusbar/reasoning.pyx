# cython: language_level=3
"""One table between OpenAI-style effort words and Anthropic/Gemini/Bedrock thinking budgets, and
Claude's extended-thinking rules (declared in reasoning.pxd)."""

# SPEC 1.5 limits.reasoning_effort_budgets defaults. "none" is OpenAI's newest word and means what
# Gemini spells thinkingBudget 0 (no thinking).
DEFAULT_BUDGETS = (1024, 4096, 8192, 16384)     # minimal, low, medium, high
EFFORTS = ("minimal", "low", "medium", "high")
cdef dict BUDGET_OF_EFFORT = {"none": 0}
# The same table as C integers, for a budget's word: the largest budget of each word but high.
cdef long long B_MINIMAL, B_LOW, B_MEDIUM


def configure(budgets=DEFAULT_BUDGETS):
    """The process's effort table: `limits.reasoning_effort_budgets` (minimal, low, medium, high;
    ascending, all > 0, as the config loader checks), set when a config's snapshot is built
    (busbar/engine/snapshot.py), so a request reads it as a C global. One table per process: a
    worker serves one config at a time (a reload swaps it with the snapshot)."""
    global B_MINIMAL, B_LOW, B_MEDIUM
    budgets = tuple(int(b) for b in budgets)
    if len(budgets) != 4 or any(b <= 0 for b in budgets) or list(budgets) != sorted(budgets):
        raise ValueError("effort budgets are four ascending positive integers")
    for word, b in zip(EFFORTS, budgets):
        BUDGET_OF_EFFORT[word] = b
    B_MINIMAL, B_LOW, B_MEDIUM = budgets[0], budgets[1], budgets[2]


def effort_budgets():
    """The effort table in force: {word: tokens}, "none" included."""
    return dict(BUDGET_OF_EFFORT)


configure()

# With thinking on, Claude only accepts top_p in [0.95, 1] (Anthropic extended-thinking docs).
cdef double CLAUDE_THINKING_MIN_TOP_P = 0.95


cpdef object budget_of_effort(str effort):
    if effort is None:
        return None
    return BUDGET_OF_EFFORT.get(effort)


cpdef str effort_of_budget(object budget):
    """A thinking budget in tokens -> the smallest effort word whose budget (the configured
    table) covers it. Gemini's -1 (dynamic) means medium; 0 (thinking off) and a non-integer mean
    no word."""
    cdef long long b
    if type(budget) is not int or budget == 0:
        return None
    b = budget
    if b < 0:
        return "medium"
    if b <= B_MINIMAL:
        return "minimal"
    if b <= B_LOW:
        return "low"
    if b <= B_MEDIUM:
        return "medium"
    return "high"


cpdef object thinking_budget(object budget, str effort):
    """The budget in tokens a request asks for: its own budget (a negative, "dynamic", budget
    counts as medium's), else its effort word's, else None."""
    if type(budget) is int or type(budget) is float:
        return BUDGET_OF_EFFORT["medium"] if budget < 0 else int(budget)
    return budget_of_effort(effort)


cpdef object claude_budget(object budget, str effort, object max_tokens):
    """The budget_tokens to send Claude, or None for no thinking: at least Claude's floor, and
    leaving CLAUDE_MIN_ANSWER tokens of an integer max_tokens for the answer; None when that
    leaves less than the floor. The caller still checks the conversation rules (no thinking with
    a forced tool, nor mid tool loop after a turn without thinking)."""
    cdef object b = thinking_budget(budget, effort)
    if b is None or b <= 0:
        return None
    if b < CLAUDE_MIN_BUDGET:
        b = CLAUDE_MIN_BUDGET
    if type(max_tokens) is int and b > max_tokens - CLAUDE_MIN_ANSWER:
        b = max_tokens - CLAUDE_MIN_ANSWER
    return b if b >= CLAUDE_MIN_BUDGET else None


cdef bint claude_top_p_ok(object top_p):
    return top_p is None or top_p >= CLAUDE_THINKING_MIN_TOP_P

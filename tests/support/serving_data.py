"""The two tenants' corpora of the serving tests and the fake LLM's fixed replies, in one place for
the fixtures that build them and the tests that check what they return."""

# Topic subsets of the Python language reference (ships with Python): disjoint, so isolation is
# checkable by doc id; `with`/context managers/exceptions live only in beta.
ALPHA_TOPICS = ["for", "while", "if", "break", "continue", "pass", "return", "global", "nonlocal", "lambda",
                "booleans", "comparisons", "integers", "floating", "assert", "del"]
BETA_TOPICS = ["with", "context-managers", "try", "exceptions", "raise", "dict", "lists", "strings", "slicings",
               "subscriptions", "yield", "await", "import", "in"]

HYDE_PASSAGE = ("A with statement calls the context manager's __enter__ method on entry and its __exit__ "
                "method on exit, even when the block raises an exception.")
IDK_MARKER = "penguin"  # a question containing it makes the fake LLM answer "I don't know"

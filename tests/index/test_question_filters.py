"""Q-Q pruning, question filters and atom pooling on real MiniLM vectors (pure numpy, no Ray)."""

from __future__ import annotations

import numpy as np
import pytest

from qrag_ray.config.index import FilterConfig
from qrag_ray.index.question_filters import content_words, filter_chunk_rows, greedy_prune, pool, select_questions

pytestmark = pytest.mark.integration  # real Ray, MiniLM, FAISS or Serve

QUESTIONS = ["What does the break statement do?", "What does the break statement do in Python?",
      "What does a break statement do?", "Does break skip the else clause of a loop?"]
CHUNK = ("break may only occur syntactically nested in a for or while loop. It terminates the nearest "
         "enclosing loop, skipping the optional else clause if the loop has one.")


def test_greedy_prune_keeps_first_of_near_duplicates(embed):
    vecs = embed(QUESTIONS)
    sims = vecs @ vecs.T
    assert sims[0, 1] > 0.8 and sims[0, 2] > 0.8 and sims[0, 3] < 0.8
    assert greedy_prune(vecs, 0.8).tolist() == [0, 3]
    assert greedy_prune(vecs, 1.0).tolist() == [0, 1, 2, 3]  # tau=1 keeps everything (no exact duplicates)
    assert greedy_prune(vecs, -0.99).tolist() == [0]  # a chunk always keeps its first question
    assert greedy_prune(np.zeros((0, 4), np.float32), 0.5).tolist() == []


def test_greedy_prune_matches_definition(embed):
    """Every kept question has cosine <= tau to all earlier kept ones; every dropped one > tau to some."""
    vecs = embed(QUESTIONS + ["How do I exit a loop early?", "How can I leave a loop before it ends?"])
    tau = 0.75
    kept = greedy_prune(vecs, tau).tolist()
    for i in range(len(vecs)):
        earlier = [j for j in kept if j < i]
        if i in kept:
            assert all(vecs[i] @ vecs[j] <= tau for j in earlier)
        else:
            assert any(vecs[i] @ vecs[j] > tau for j in earlier)


def test_select_questions_similarity_and_overlap(embed):
    questions = QUESTIONS + ["What is the capital of France?"]
    question_vecs = embed(questions)
    chunk_vec = embed([CHUNK])[0]
    keep = select_questions(question_vecs, questions, chunk_vec, CHUNK, FilterConfig(min_question_chunk_sim=0.2))
    assert keep.tolist() == [True, True, True, True, False]
    keep = select_questions(question_vecs, questions, chunk_vec, CHUNK, FilterConfig(require_content_overlap=True))
    assert not keep[-1] and keep[:4].all()
    keep = select_questions(question_vecs, questions, chunk_vec, CHUNK,
                            FilterConfig(prune_tau=0.8, min_question_chunk_sim=0.2))
    assert keep.tolist() == [True, False, False, True, False]
    assert "break" in content_words(CHUNK) and "the" not in content_words(CHUNK)


def _rows(embed, questions):
    """One chunk's rows as the pipeline lays them out: chunk (aux), questions, quotes linked by qn."""
    kind = np.array(["chunk"] + ["question"] * len(questions) + ["quote"] * len(questions), dtype=object)
    qn = np.array([-1] + list(range(len(questions))) * 2)
    store = np.array([False] + [False] * len(questions) + [True] * len(questions))
    texts = [CHUNK] + questions + questions
    vecs = embed([CHUNK] + questions + [f"{q}\n{CHUNK}" for q in questions])
    return kind, qn, store, texts, vecs


def test_pruned_question_takes_its_quote_vector_with_it(embed):
    kind, qn, store, texts, vecs = _rows(embed, QUESTIONS)
    keep, _ = filter_chunk_rows(kind, qn, store, texts, vecs, FilterConfig(prune_tau=0.8))
    kept_quotes = [texts[i] for i in np.flatnonzero(keep)]
    assert kept_quotes == [QUESTIONS[0], QUESTIONS[3]] and all(kind[keep] == "quote")


def test_fallback_keeps_chunk_reachable(embed):
    questions = ["What is the capital of France?", "Who painted the Mona Lisa?"]
    kind, qn, store, texts, vecs = _rows(embed, questions)
    cfg = FilterConfig(min_question_chunk_sim=0.3)
    keep, _ = filter_chunk_rows(kind, qn, store, texts, vecs, cfg)
    assert keep.tolist() == [True, False, False, False, False]  # only the chunk's own vector
    off, _ = filter_chunk_rows(kind, qn, store, texts, vecs, FilterConfig(min_question_chunk_sim=0.3,
                                                                        keep_chunk_fallback=False))
    assert not off.any()


@pytest.mark.parametrize("tau", [None, 0.8])
def test_no_filter_keeps_stored_rows(embed, tau):
    kind, qn, store, texts, vecs = _rows(embed, QUESTIONS)
    keep, _ = filter_chunk_rows(kind, qn, store, texts, vecs, FilterConfig(prune_tau=tau))
    assert not keep[0]  # the aux chunk vector is never written when not part of the representation
    if tau is None:
        assert (keep == store).all()


SENTENCES = ["The Nile flows north into the Mediterranean Sea.", "The river Nile runs northward to the Mediterranean.",
             "Cairo was founded in 969 by the Fatimids.", "The Fatimid caliphs built the city of Cairo in 969.",
             "Cotton grows well in the delta's soil."]
PASSAGE = " ".join(SENTENCES)


def test_pooling_merges_paraphrases_into_unit_centroids(embed):
    vecs = embed(SENTENCES)
    reps, cents = pool(vecs, 3)
    assert len(reps) == 3 and np.allclose(np.linalg.norm(cents, axis=1), 1, atol=1e-5)
    groups = sorted(sorted(int(j) for j in np.flatnonzero(np.argmax(vecs @ cents.T, axis=1) == c)) for c in range(3))
    assert groups == [[0, 1], [2, 3], [4]]  # each paraphrase pair pooled, the odd one alone
    assert pool(vecs, 9)[0].tolist() == [0, 1, 2, 3, 4] and np.allclose(pool(vecs, 9)[1], vecs)  # nothing to pool


def test_max_atoms_keeps_the_chunk_and_at_most_m_pooled_atoms(embed):
    kind = np.array(["chunk"] + ["sentence"] * 5, dtype=object)
    texts = [PASSAGE] + SENTENCES
    vecs = embed(texts)
    keep, out = filter_chunk_rows(kind, np.full(6, -1), np.ones(6, bool), texts, vecs,
                                  FilterConfig(max_atoms=2))
    assert keep[0] and keep.sum() == 3 and np.allclose(out[0], vecs[0])
    moved = [i for i in np.flatnonzero(keep)[1:] if not np.allclose(out[i], vecs[i])]
    assert moved and np.allclose(np.linalg.norm(out[keep], axis=1), 1, atol=1e-5)  # centroids, unit norm
    keep_all, same = filter_chunk_rows(kind, np.full(6, -1), np.ones(6, bool), texts, vecs, FilterConfig())
    assert keep_all.all() and np.array_equal(same, vecs)

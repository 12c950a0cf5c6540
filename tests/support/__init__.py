"""What the test modules share: one Ray session, one corpus, one index builder."""

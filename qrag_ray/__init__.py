"""qrag-ray: question-based retrieval indexed with Ray Data and served with Ray Serve."""

__version__ = "0.2.0"

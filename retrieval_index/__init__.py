"""Corpus -> Lucene BM25 index (pyserini), the Flask retrieval server, and its HTTP client."""

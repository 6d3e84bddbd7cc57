"""Text for the mixtures: label phrases, captions, LLM templates and the phrase-cluster inventory."""

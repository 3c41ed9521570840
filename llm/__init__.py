"""LLM and embedding backends, the response cache and the embedded default models: the only
memgym code that talks to models. Imports none of memgym's other packages.

Modules: ``base`` (protocols, params, errors, ``check_batch``), ``specs`` (``load_backend("hf:…"|"openai:…#…"|
"vllm:…")``), ``hf_backend``, ``openai_backend``, ``vllm_backend``, ``cache``
(``ResponseCache``, ``CachedBackend``), ``embeddings`` (``STEmbedder``, ``EmbeddingCache``,
``HashEmbedder``), ``models`` (``prepare_smollm2``, ``minilm_dir``), ``server`` (a builtin
OpenAI-compatible server), ``paths`` (``cache_dir``). Heavy modules (torch, transformers) are
imported only by the modules that need them.
"""

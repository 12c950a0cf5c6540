"""Configuration by role: the index build (IndexConfig), its search policy, LLM settings, presets, YAML."""

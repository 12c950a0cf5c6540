"""Process plumbing every layer uses: Ray started or joined in one place, logs, progress, ports."""

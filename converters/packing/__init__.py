"""The pack loop: read → examine → (re-encode) → write behind, resumable, with its report."""

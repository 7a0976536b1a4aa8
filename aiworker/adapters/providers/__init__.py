"""Coding-agent providers behind one small interface; `script` replays scenarios."""

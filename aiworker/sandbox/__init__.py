"""The sandbox forge: a Forgejo-API-compatible server over real bare git repositories."""

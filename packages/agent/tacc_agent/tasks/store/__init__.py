"""The user's files on shared storage: the delta upload and where things live."""

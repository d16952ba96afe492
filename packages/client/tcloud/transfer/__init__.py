"""Moving a task's bytes: the upload's manifest and hash cache, the streamed upload, and
files to and from the user's cluster directory."""

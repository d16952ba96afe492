"""Container images: resolved, pulled and cached, built from a task's build file."""

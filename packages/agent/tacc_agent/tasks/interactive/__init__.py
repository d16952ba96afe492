"""Into a running job: attach, connect and relay, the idle watchdog, live usage."""

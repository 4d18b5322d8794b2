"""Browser tests: headless Chromium driving the admin (``-m browser``)."""

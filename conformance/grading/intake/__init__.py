"""A class's submissions as the grader receives them, made gradable: found in an LMS download
(``discovery``), unpacked (``archives``), notebooks converted (``notebooks``), each student's
files in one hashed directory (``staging``), and the roster (``roster``)."""

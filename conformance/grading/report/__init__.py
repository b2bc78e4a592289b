"""What comes out of grading: each student's record (``student``), their feedback
(``feedback``, in words a student can act on: ``student_text``, built of typed blocks:
``document``), the class report (``class_report``) and the files written (``outputs``)."""

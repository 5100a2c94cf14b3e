# nbgrader's configuration for every user of the hub: hub.sh install copies it, with the course id
# filled in, to <hub venv>/etc/jupyter/nbgrader_config.py (on every server's config path).
# The exchange is one world-writable folder; nbgrader keeps each learner's inbound submission
# and its released feedback from the others (names hidden behind timestamps and hashes).
c = get_config()  # noqa: F821
c.CourseDirectory.course_id = "@COURSE@"
c.Exchange.root = "@EXCHANGE@"

"""The statement triggers that join a request UPDATE's old and new rows on id (history,
hourly stats, state counters, usage) plan that join once per session, with the row counts of
their first call, and keep the plan. A session's first UPDATE of requests usually changes none
or one (statement triggers fire for zero rows too), so the join became a nested loop, quadratic
in the rows an UPDATE changes: a cycle's claim of 750 requests spent about 100 ms in each of
these triggers (auto_explain: 750 x 750 rows scanned), a 100,000-request cancel would take
hours. Without nested loops the join is a hash or merge join whatever the first call's size;
these functions read only the transition tables, so nothing else loses an index nested loop
(carousel_usage_job, which reads requests by job, is left as it is). And without JIT: a join
that cannot be anything but a nested loop (the usage totals' LATERAL VALUES) now costs more
than jit_above_cost, and compiling it took 950 ms for a statement that runs in 2. PostgreSQL
only: SQLite's triggers are row triggers."""
from django.db import migrations

FUNCTIONS = ["carousel_record_transitions()", "carousel_hourly_stats()", "carousel_state_counts_update()",
             "carousel_usage_update()"]


def _alter(*clauses):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            for function in FUNCTIONS:
                for clause in clauses:
                    schema_editor.execute(f"ALTER FUNCTION {function} {clause}")
    return run


class Migration(migrations.Migration):
    dependencies = [("carousel", "0015_merge_update_trigger")]
    operations = [migrations.RunPython(_alter("SET enable_nestloop = off", "SET jit = off"),
                                       _alter("RESET enable_nestloop", "RESET jit"))]

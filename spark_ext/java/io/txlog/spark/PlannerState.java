package io.txlog.spark;

/**
 * What the driver's planner process holds, for operators and tests (through py4j:
 * {@code spark._jvm.io.txlog.spark.PlannerState.openWrites()}).
 */
public final class PlannerState {
    private PlannerState() {
    }

    /** Writes begun in the planner and not yet committed or aborted. */
    public static long openWrites() {
        return Planner.call(Planner.request("writes_open")).get("writes").asLong();
    }
}

package txlog;

import io.txlog.spark.TxlogProvider;

/**
 * {@code format("txlog")} and {@code USING txlog} in the JVM.
 *
 * <p>Spark resolves a format name first through {@code DataSourceRegister} service entries,
 * then as a class name, then as {@code <name>.DefaultSource}, and only then as a Python data
 * source; a service entry named {@code txlog} next to the registered Python source of the
 * same name is an error ("found multiple data sources"). Found by this class name instead,
 * the JVM connector serves wherever this jar is on the classpath, and the Python data
 * source wherever it is not (Spark Connect clients, serverless), with no conflict.
 */
public final class DefaultSource extends TxlogProvider {
}

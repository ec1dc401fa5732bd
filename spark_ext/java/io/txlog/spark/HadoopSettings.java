package io.txlog.spark;

import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.Map;

import com.fasterxml.jackson.databind.JsonNode;
import org.apache.hadoop.conf.Configuration;
import org.apache.spark.SparkContext;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Puts the Hadoop settings the planner derived from a root's {@code storage_options}
 * (spark_ext/hadoop_conf.py: S3A endpoint, credentials and path-style access, scoped to
 * the root's bucket) into the SparkContext's Hadoop configuration, from which every scan
 * and write ships its configuration to the executors: the user states them once.
 */
final class HadoopSettings {
    private static final Logger LOG = LoggerFactory.getLogger(HadoopSettings.class);

    private HadoopSettings() {
    }

    /** Applies {@code settings} (a JSON object of strings; null or empty: nothing). */
    static void apply(JsonNode settings) {
        if (settings == null || !settings.isObject() || settings.isEmpty()) {
            return;
        }
        Configuration conf = SparkContext.getOrCreate().hadoopConfiguration();
        List<String> changed = new ArrayList<>();
        synchronized (conf) {
            Iterator<Map.Entry<String, JsonNode>> it = settings.fields();
            while (it.hasNext()) {
                Map.Entry<String, JsonNode> e = it.next();
                String value = e.getValue().asText();
                String old = conf.get(e.getKey());
                if (!value.equals(old)) {
                    if (old != null) {
                        changed.add(e.getKey());  // names only: values may be secrets
                    }
                    conf.set(e.getKey(), value);
                }
            }
        }
        if (!changed.isEmpty()) {
            // Hadoop keeps one filesystem per bucket per JVM: those already open keep the
            // settings they were opened with.
            LOG.warn("txlog: storage_options change {} from what this Spark application used "
                + "before; filesystems already open keep the old settings. Use one set of "
                + "storage_options per bucket in an application", changed);
        }
    }
}

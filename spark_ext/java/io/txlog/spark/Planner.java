package io.txlog.spark;

import java.io.BufferedReader;
import java.io.BufferedWriter;
import java.io.File;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.OutputStreamWriter;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import org.apache.spark.SparkConf;
import org.apache.spark.SparkContext;

/**
 * txlog's Python planner, as the driver JVM reaches it: one process per driver JVM
 * ({@code python -m spark_ext.planner_server}) started with the driver's interpreter on
 * first use, kept alive, and spoken to in JSON lines, one request and one answer at a time.
 *
 * <p>Every decision about what a read returns (visible offsets, the LSO, aborted ranges,
 * rolling decided transactions forward) and every commit stays in txlog's Python code;
 * this class only carries the questions and the answers. The interpreter is the first of
 * {@code spark.txlog.python}, {@code spark.pyspark.driver.python},
 * {@code spark.pyspark.python}, {@code $PYSPARK_DRIVER_PYTHON}, {@code $PYSPARK_PYTHON}
 * and {@code python3} that is set.
 */
final class Planner {
    private static final ObjectMapper JSON = new ObjectMapper();
    private static Planner running;

    private final Process process;
    private final BufferedWriter requests;
    private final BufferedReader answers;
    private final String python;

    private Planner(String python) throws IOException {
        this.python = python;
        ProcessBuilder pb = new ProcessBuilder(python, "-m", "spark_ext.planner_server");
        pb.redirectError(ProcessBuilder.Redirect.INHERIT);
        this.process = pb.start();
        this.requests = new BufferedWriter(
            new OutputStreamWriter(process.getOutputStream(), StandardCharsets.UTF_8));
        this.answers = new BufferedReader(
            new InputStreamReader(process.getInputStream(), StandardCharsets.UTF_8));
    }

    static ObjectNode request(String op) {
        ObjectNode r = JSON.createObjectNode();
        r.put("op", op);
        return r;
    }

    static ObjectNode options(Map<String, String> options) {
        ObjectNode o = JSON.createObjectNode();
        for (Map.Entry<String, String> e : options.entrySet()) {
            o.put(e.getKey(), e.getValue());
        }
        return o;
    }

    /** The planner's answer to {@code request}; a txlog error is thrown as a
     * {@link TxlogException} carrying its class and message. */
    static synchronized JsonNode call(ObjectNode request) {
        String line;
        try {
            line = JSON.writeValueAsString(request);
        } catch (IOException e) {
            throw new IllegalStateException("txlog: cannot encode a planner request: " + e, e);
        }
        JsonNode answer = null;
        IOException failure = null;
        // A planner that died (killed, out of memory) is started again once: requests
        // carry everything the planner needs, so nothing is lost with the old process.
        for (int attempt = 0; attempt < 2 && answer == null; attempt++) {
            try {
                if (running == null || !running.process.isAlive()) {
                    running = new Planner(interpreter());
                }
                answer = running.exchange(line);
            } catch (IOException e) {
                failure = e;
                if (running != null) {
                    running.process.destroy();
                    running = null;
                }
            }
        }
        if (answer == null) {
            throw new TxlogException("txlog.errors.ConfigError",
                "txlog's planner process (" + describe() + " -m spark_ext.planner_server) is "
                    + "not answering: " + failure + ". The driver's Python needs txlog "
                    + "installed; set spark.txlog.python to an interpreter that has it");
        }
        JsonNode error = answer.get("error");
        if (error != null) {
            throw new TxlogException(error.path("type").asText("txlog.errors.TxlogError"),
                                     error.path("message").asText(""));
        }
        return answer;
    }

    private JsonNode exchange(String line) throws IOException {
        requests.write(line);
        requests.write('\n');
        requests.flush();
        String reply = answers.readLine();
        if (reply == null) {
            throw new IOException("the planner exited (" + python + ")");
        }
        return JSON.readTree(reply);
    }

    private static String describe() {
        try {
            return interpreter();
        } catch (RuntimeException e) {
            return "python";
        }
    }

    static String interpreter() {
        List<String> candidates = new ArrayList<>();
        SparkConf conf = null;
        try {
            conf = SparkContext.getOrCreate().getConf();  // the driver always has one
        } catch (RuntimeException e) {
            conf = null;
        }
        if (conf != null) {
            for (String key : new String[] {"spark.txlog.python", "spark.pyspark.driver.python",
                                            "spark.pyspark.python"}) {
                candidates.add(conf.get(key, null));
            }
        }
        candidates.add(System.getenv("PYSPARK_DRIVER_PYTHON"));
        candidates.add(System.getenv("PYSPARK_PYTHON"));
        for (String c : candidates) {
            if (c != null && !c.isEmpty() && (!c.contains(File.separator) || new File(c).canExecute())) {
                return c;
            }
        }
        return "python3";
    }
}

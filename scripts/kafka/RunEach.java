import java.lang.reflect.InvocationTargetException;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.List;

/**
 * Several runs of Kafka's command-line tools in one JVM (``kafka_local.py tools``): a JVM start per command
 * costs seconds. Each line of standard input is one run: its tool's class, then its arguments, separated by NUL
 * characters. A run that exits the JVM ends the rest: with its own status when it failed, with 1 when it
 * succeeded (a tool that exits when done, as kafka-topics does, cannot share a JVM), so the status is 0 only
 * when every run returned.
 */
public class RunEach {
    private static volatile int done;

    public static void main(String[] ignored) throws Throwable {
        List<String> runs = new String(System.in.readAllBytes(), StandardCharsets.UTF_8).lines()
                .filter(line -> !line.isEmpty()).toList();
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            if (done < runs.size()) {
                System.err.println("kafka_local: run " + (done + 1) + " of " + runs.size() + " stopped the JVM; the rest did not run");
                Runtime.getRuntime().halt(1);
            }
        }));
        for (String run : runs) {
            String[] fields = run.split("\0", -1);
            try {
                Class.forName(fields[0]).getMethod("main", String[].class)
                        .invoke(null, (Object) Arrays.copyOfRange(fields, 1, fields.length));
            } catch (InvocationTargetException e) {
                throw e.getCause();
            }
            done++;
        }
        System.exit(0);
    }
}

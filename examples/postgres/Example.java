// A producer and a consumer in Java of the work queue queue.emails of the example catalog
// (database/queues.yml, what `make demo` deploys), through the queue's functions only: enqueue,
// wait, dequeue with a lease token, complete, and an error told by its SQLSTATE (docs/errors.md).
// One file, no build:
//
//   TABLEQUEUE_JDBC_URL='jdbc:postgresql://host:5432/db?user=app&password=secret' \
//       java -cp /usr/share/java/postgresql.jar examples/postgres/Example.java
//
// Exit code 0 when every step did what the contract says, 1 otherwise.
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.util.UUID;

public class Example {
    // docs/errors.md: the SQLSTATE of invalid_argument (SQL Server raises 51001).
    static final String INVALID_ARGUMENT = "TQ001";
    static final String WORKER = "java-example";

    public static void main(String[] args) throws SQLException {
        String url = System.getenv("TABLEQUEUE_JDBC_URL");
        if (url == null) {
            System.err.println("set TABLEQUEUE_JDBC_URL, e.g. jdbc:postgresql://localhost:5432/db?user=app&password=secret");
            System.exit(2);
        }
        try (Connection conn = DriverManager.getConnection(url)) {
            // Producer: one message; id is the message's id, duplicate is true only with a dedupe key seen before.
            long enqueued;
            try (PreparedStatement enqueue = conn.prepareStatement(
                    "SELECT id, duplicate FROM queue.emails_enqueue(payload => ?::jsonb)")) {
                enqueue.setString(1, "{\"to\": \"a@example.com\", \"template\": \"welcome\"}");
                enqueued = single(enqueue).getLong("id");
            }
            System.out.println("enqueued message " + enqueued);

            // Consumer: wait for a message instead of polling. The wait procedure commits between its
            // 50 ms steps, so it runs outside any transaction (autocommit, the JDBC default).
            try (PreparedStatement wait = conn.prepareStatement(
                    "CALL queue.emails_wait(wait_ms => ?, ready => NULL)")) {
                wait.setInt(1, 5000);
                check(single(wait).getBoolean("ready"), "a message is ready within 5 s");
            }

            // Lease it, do the work, complete it with the lease token: in one transaction, so the
            // work's own writes (none here) commit together with the acknowledgement.
            conn.setAutoCommit(false);
            long id;
            UUID token;
            try (PreparedStatement dequeue = conn.prepareStatement(
                    "SELECT id, payload, attempts, lease_token FROM queue.emails_dequeue(batch_size => 1, worker => ?, lease_seconds => 60)")) {
                dequeue.setString(1, WORKER);
                ResultSet message = single(dequeue);
                id = message.getLong("id");
                token = message.getObject("lease_token", UUID.class);
                System.out.println("dequeued message " + id + " (attempt " + message.getInt("attempts") + "): "
                        + message.getString("payload"));
            }
            check(id == enqueued, "the message dequeued is the one enqueued");
            try (PreparedStatement complete = conn.prepareStatement(
                    "SELECT completed FROM queue.emails_complete(id => ?, worker => ?, lease_token => ?)")) {
                complete.setLong(1, id);
                complete.setString(2, WORKER);
                complete.setObject(3, token);
                check(single(complete).getBoolean("completed"), "complete reports the message completed");
            }
            conn.commit();
            System.out.println("completed message " + id);

            // An error told by its number: a batch size of 0 is invalid_argument. PostgreSQL aborts the
            // transaction on any error: roll back and go on.
            try (PreparedStatement invalid = conn.prepareStatement(
                    "SELECT id FROM queue.emails_dequeue(batch_size => 0, worker => ?)")) {
                invalid.setString(1, WORKER);
                invalid.executeQuery().close();
                check(false, "a batch size of 0 is refused");
            } catch (SQLException e) {
                if (!INVALID_ARGUMENT.equals(e.getSQLState())) {
                    throw e;
                }
                conn.rollback();
                System.out.println("refused as documented: " + e.getSQLState() + " invalid_argument");
            }
        }
    }

    static ResultSet single(PreparedStatement statement) throws SQLException {
        ResultSet row = statement.executeQuery();
        check(row.next(), "the call returns a row");
        return row;
    }

    static void check(boolean condition, String what) {
        if (!condition) {
            System.err.println("FAILED: " + what);
            System.exit(1);
        }
    }
}

// A producer and a consumer in Java of the work queue queue.emails of the example catalog
// (database/queues.yml, what `make demo` deploys), through the queue's functions only: enqueue,
// wait, dequeue with a lease token, complete, fail, and an error told by its SQLSTATE (docs/errors.md).
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

            check(consume(conn).equals("completed " + enqueued), "the message enqueued is completed");

            // Work that fails: a message without a recipient is failed, its attempt spent.
            long poison;
            try (PreparedStatement enqueue = conn.prepareStatement(
                    "SELECT id FROM queue.emails_enqueue(payload => ?::jsonb)")) {
                enqueue.setString(1, "{\"template\": \"welcome\"}");
                poison = single(enqueue).getLong("id");
            }
            check(consume(conn).equals("retrying " + poison), "the message without a recipient is failed");

            // An error told by its number: a batch size of 0 is invalid_argument. PostgreSQL aborts the
            // transaction on any error: roll back and go on.
            conn.setAutoCommit(false);
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

    // One message: "<outcome> <id>". The lease is taken on its own, in autocommit, so that it and the
    // attempt it counts commit at once: a consumer that dies during the work still spends the attempt,
    // and a message that kills every consumer reaches max_attempts and the dead letters. The work and
    // complete then run in one transaction, so the work's own writes commit with the acknowledgement;
    // work that fails rolls back and is failed with its error, visible again after 60 s.
    static String consume(Connection conn) throws SQLException {
        long id;
        UUID token;
        String payload;
        try (PreparedStatement dequeue = conn.prepareStatement(
                "SELECT id, payload, attempts, lease_token FROM queue.emails_dequeue(batch_size => 1, worker => ?, lease_seconds => 60)")) {
            dequeue.setString(1, WORKER);
            ResultSet message = single(dequeue);
            id = message.getLong("id");
            token = message.getObject("lease_token", UUID.class);
            payload = message.getString("payload");
            System.out.println("dequeued message " + id + " (attempt " + message.getInt("attempts") + "): " + payload);
        }
        conn.setAutoCommit(false);
        try {
            send(payload);
            try (PreparedStatement complete = conn.prepareStatement(
                    "SELECT completed FROM queue.emails_complete(id => ?, worker => ?, lease_token => ?)")) {
                complete.setLong(1, id);
                complete.setString(2, WORKER);
                complete.setObject(3, token);
                check(single(complete).getBoolean("completed"), "complete reports the message completed");
            }
            conn.commit();
            System.out.println("completed message " + id);
            return "completed " + id;
        } catch (Exception e) {
            conn.rollback();
            conn.setAutoCommit(true);
            try (PreparedStatement fail = conn.prepareStatement(
                    "SELECT outcome FROM queue.emails_fail(id => ?, worker => ?, error => ?, retry_after_seconds => 60, lease_token => ?)")) {
                fail.setLong(1, id);
                fail.setString(2, WORKER);
                fail.setString(3, e.toString());
                fail.setObject(4, token);
                String outcome = single(fail).getString("outcome");
                System.out.println("failed message " + id + ": " + outcome + " (" + e + ")");
                return outcome + " " + id;
            }
        } finally {
            conn.setAutoCommit(true);
        }
    }

    // The work: a stand-in for sending the email (its database writes would go through conn).
    static void send(String payload) {
        if (!payload.contains("\"to\"")) {
            throw new IllegalArgumentException("no recipient (payload.to)");
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

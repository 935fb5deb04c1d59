// The SQL Server twin of examples/postgres/Example.java: a producer and a consumer of the work queue
// queue.emails of the example catalog (database/queues.yml) through the queue's procedures only:
// enqueue, wait, dequeue with a lease token, complete, fail, and an error told by its number
// (docs/errors.md). Not run on this project's machines (no SQL Server there); tests/test_examples.py
// compiles it. With Microsoft's JDBC driver (mssql-jdbc, Maven com.microsoft.sqlserver:mssql-jdbc):
//
//   TABLEQUEUE_JDBC_URL='jdbc:sqlserver://host:1433;databaseName=db;user=app;password=secret;encrypt=true' \
//       java -cp mssql-jdbc.jar examples/sqlserver/Example.java
//
// Exit code 0 when every step did what the contract says, 1 otherwise.
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;

public class Example {
    // docs/errors.md: the error number of invalid_argument (PostgreSQL raises SQLSTATE TQ001).
    static final int INVALID_ARGUMENT = 51001;
    static final String WORKER = "java-example";

    public static void main(String[] args) throws SQLException {
        String url = System.getenv("TABLEQUEUE_JDBC_URL");
        if (url == null) {
            System.err.println("set TABLEQUEUE_JDBC_URL, e.g. jdbc:sqlserver://localhost:1433;databaseName=db;user=app;password=secret");
            System.exit(2);
        }
        try (Connection conn = DriverManager.getConnection(url)) {
            // Producer: one message; each procedure answers with one result set.
            long enqueued;
            try (PreparedStatement enqueue = conn.prepareStatement("EXEC queue.emails_enqueue @payload = ?")) {
                enqueue.setString(1, "{\"to\": \"a@example.com\", \"template\": \"welcome\"}");
                enqueued = single(enqueue).getLong("id");
            }
            System.out.println("enqueued message " + enqueued);

            // Consumer: wait for a message instead of polling (WAITFOR steps of 50 ms on the server;
            // keep the statement's query timeout above wait_ms).
            try (PreparedStatement wait = conn.prepareStatement("EXEC queue.emails_wait @wait_ms = ?")) {
                wait.setInt(1, 5000);
                check(single(wait).getBoolean("ready"), "a message is ready within 5 s");
            }

            check(consume(conn).equals("completed " + enqueued), "the message enqueued is completed");

            // Work that fails: a message without a recipient is failed, its attempt spent.
            long poison;
            try (PreparedStatement enqueue = conn.prepareStatement("EXEC queue.emails_enqueue @payload = ?")) {
                enqueue.setString(1, "{\"template\": \"welcome\"}");
                poison = single(enqueue).getLong("id");
            }
            check(consume(conn).equals("retrying " + poison), "the message without a recipient is failed");

            // An error told by its number: a batch size of 0 is invalid_argument. The procedure checks
            // its arguments before XACT_ABORT ON, so the open transaction survives the error.
            conn.setAutoCommit(false);
            try (PreparedStatement invalid = conn.prepareStatement(
                    "EXEC queue.emails_dequeue @batch_size = 0, @worker = ?")) {
                invalid.setString(1, WORKER);
                invalid.execute();
                check(false, "a batch size of 0 is refused");
            } catch (SQLException e) {
                if (e.getErrorCode() != INVALID_ARGUMENT) {
                    throw e;
                }
                conn.rollback();
                System.out.println("refused as documented: " + e.getErrorCode() + " invalid_argument");
            }
        }
    }

    // One message: "<outcome> <id>". The lease is taken on its own, in autocommit, so that it and the
    // attempt it counts commit at once: a consumer that dies during the work still spends the attempt,
    // and a message that kills every consumer reaches max_attempts and the dead letters. The work and
    // complete then run in one transaction (manual commit runs with IMPLICIT_TRANSACTIONS ON; the
    // procedures take the caller's transaction as theirs), so the work's own writes commit with the
    // acknowledgement; work that fails rolls back and is failed with its error, visible again after 60 s.
    static String consume(Connection conn) throws SQLException {
        long id;
        String token;
        String payload;
        try (PreparedStatement dequeue = conn.prepareStatement(
                "EXEC queue.emails_dequeue @batch_size = 1, @worker = ?, @lease_seconds = 60")) {
            dequeue.setString(1, WORKER);
            ResultSet message = single(dequeue);
            id = message.getLong("id");
            token = message.getString("lease_token");
            payload = message.getString("payload");
            System.out.println("dequeued message " + id + " (attempt " + message.getInt("attempts") + "): " + payload);
        }
        conn.setAutoCommit(false);
        try {
            send(payload);
            try (PreparedStatement complete = conn.prepareStatement(
                    "EXEC queue.emails_complete @id = ?, @worker = ?, @lease_token = ?")) {
                complete.setLong(1, id);
                complete.setString(2, WORKER);
                complete.setString(3, token);
                check(single(complete).getBoolean("completed"), "complete reports the message completed");
            }
            conn.commit();
            System.out.println("completed message " + id);
            return "completed " + id;
        } catch (Exception e) {
            conn.rollback();
            conn.setAutoCommit(true);
            try (PreparedStatement fail = conn.prepareStatement(
                    "EXEC queue.emails_fail @id = ?, @worker = ?, @error = ?, @retry_after_seconds = 60, @lease_token = ?")) {
                fail.setLong(1, id);
                fail.setString(2, WORKER);
                fail.setString(3, e.toString());
                fail.setString(4, token);
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

    // The first result set's first row (a procedure may send update counts before its result set).
    static ResultSet single(PreparedStatement statement) throws SQLException {
        boolean isResultSet = statement.execute();
        while (!isResultSet && statement.getUpdateCount() != -1) {
            isResultSet = statement.getMoreResults();
        }
        check(isResultSet, "the call returns a result set");
        ResultSet row = statement.getResultSet();
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

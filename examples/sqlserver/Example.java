// The SQL Server twin of examples/postgres/Example.java: a producer and a consumer of the work queue
// queue.emails of the example catalog (database/queues.yml) through the queue's procedures only:
// enqueue, wait, dequeue with a lease token, complete, and an error told by its number
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

            // Lease it, do the work, complete it with the lease token: in one transaction, so the
            // work's own writes (none here) commit together with the acknowledgement. (Manual commit
            // runs with IMPLICIT_TRANSACTIONS ON; the procedures take the caller's transaction as theirs.)
            conn.setAutoCommit(false);
            long id;
            String token;
            try (PreparedStatement dequeue = conn.prepareStatement(
                    "EXEC queue.emails_dequeue @batch_size = 1, @worker = ?, @lease_seconds = 60")) {
                dequeue.setString(1, WORKER);
                ResultSet message = single(dequeue);
                id = message.getLong("id");
                token = message.getString("lease_token");
                System.out.println("dequeued message " + id + " (attempt " + message.getInt("attempts") + "): "
                        + message.getString("payload"));
            }
            check(id == enqueued, "the message dequeued is the one enqueued");
            try (PreparedStatement complete = conn.prepareStatement(
                    "EXEC queue.emails_complete @id = ?, @worker = ?, @lease_token = ?")) {
                complete.setLong(1, id);
                complete.setString(2, WORKER);
                complete.setString(3, token);
                check(single(complete).getBoolean("completed"), "complete reports the message completed");
            }
            conn.commit();
            System.out.println("completed message " + id);

            // An error told by its number: a batch size of 0 is invalid_argument. The procedure checks
            // its arguments before XACT_ABORT ON, so the open transaction survives the error.
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

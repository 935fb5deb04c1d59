-- The example catalog's handler for queue.thumbnails (database/queues.yml, option handler): the
-- in-database worker queue.thumbnails_process calls it as CALL queue.make_thumbnail(id, payload),
-- in the transaction that completes the message, so its writes and the completion commit together
-- (docs/work-queue.md, section 4). A real handler would render the thumbnail; this one records the
-- request. It raises to fail the message; it must not COMMIT or ROLLBACK. `make demo` deploys it.
CREATE TABLE IF NOT EXISTS "queue"."thumbnails_made" (
    id uuid NOT NULL,
    made_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    payload jsonb NOT NULL,
    CONSTRAINT pk_thumbnails_made PRIMARY KEY (id)
);

CREATE OR REPLACE PROCEDURE "queue"."make_thumbnail"(id uuid, payload jsonb)
LANGUAGE plpgsql
AS $handler$
BEGIN
    IF payload ->> 'image' IS NULL THEN
        RAISE EXCEPTION 'make_thumbnail: message % has no image', id;
    END IF;
    INSERT INTO "queue"."thumbnails_made" AS t (id, payload)
    VALUES (make_thumbnail.id, make_thumbnail.payload)
    ON CONFLICT ON CONSTRAINT pk_thumbnails_made DO NOTHING;
END
$handler$;

-- The worker runs with its caller's rights (docs/work-queue.md): the admin role may run the handler.
GRANT EXECUTE ON PROCEDURE "queue"."make_thumbnail" TO "queue_admin";

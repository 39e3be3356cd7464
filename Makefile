# `make demo` / `make test`: the same two commands as `./run.sh demo` / `./run.sh test`
# (which need only bash, for machines without make). ARGS passes options through:
#   make demo ARGS="--only vision"      make test ARGS="-k timm"
.PHONY: demo test

demo:
	./run.sh demo $(ARGS)

test:
	./run.sh test $(ARGS)

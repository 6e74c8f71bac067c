# mk/html.mk - the pictures of `mmguard predict --html` and `mmguard report
# --html` (issue 25), rendered in Debian's headless Chromium (deps/browser.txt):
#
#   make check-html     render both pages, check the screenshots and the DOM
#   make readme-picture regenerate docs/img/predict-llava-7b.png (the README's)

.PHONY: check-html readme-picture

check-html: $(BUILD)/mmguard
	sh scripts/install-deps.sh browser
	MMGUARD=$(BUILD)/mmguard sh tests/html/test_html.sh

readme-picture: $(BUILD)/mmguard
	sh scripts/install-deps.sh browser
	$(BUILD)/mmguard predict contrib/models/llava-1.5-7b-finetune.yaml --gpu-mem 80GiB \
	  --html $(BUILD)/predict.html >/dev/null
	mkdir -p docs/img
	chromium --headless=new --no-sandbox --disable-gpu --no-proxy-server --hide-scrollbars \
	  --user-data-dir=$(BUILD)/chromium-profile --window-size=960,520 \
	  --screenshot=$(abspath docs/img/predict-llava-7b.png) file://$(abspath $(BUILD)/predict.html)

CHECK_TARGETS += check-html
